// Package checkpoint keeps the checkpoints of one box: in-place memory
// snapshots (memory, devices and writable layer at one paused instant)
// stored under the box's directory and arranged in a tree. It does the
// bookkeeping only: names, the on-disk layout, each checkpoint's parent,
// the box's current position in the tree and the last rollback. The
// snapshot files inside a checkpoint's directory are the VM driver's; the
// root package saves and restores them (Box.Checkpoint, Box.Rollback).
//
// Layout, under BOXDIR/checkpoints (Dir):
//
//	state.json              the head (the checkpoint the box was last
//	                        checkpointed at or rolled back to) and the
//	                        last rollback
//	NAME/checkpoint.json    a checkpoint's record (Meta), written last:
//	                        a directory without it is unfinished
//	NAME/...                the driver's snapshot files
//	.tmp-NAME-*/            a checkpoint being taken
//
// The caller serialises the changes of one box (it holds the box's lock);
// reads take no lock: every file is replaced by a rename.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-run/airlock/internal/boundedio"
	"github.com/airlock-run/airlock/internal/checkpoint/pagediff"
)

// Version is the format version of Meta and of the state file; Read
// refuses another.
const Version = 1

// MaxName is the longest checkpoint name, in bytes.
const MaxName = 64

// MaxCheckpoints bounds how many checkpoints one box keeps: each holds a
// copy of the box's memory and writable layer.
const MaxCheckpoints = 64

// maxFile bounds the size of the files this package reads.
const maxFile = 64 << 10

const (
	dirName   = "checkpoints"
	metaFile  = "checkpoint.json"
	stateFile = "state.json"
	tmpPrefix = ".tmp-"
)

// Errors; the root package re-exports them.
var (
	// ErrNotFound: the box has no checkpoint of that name.
	ErrNotFound = errors.New("checkpoint not found")
	// ErrExists: the box has a checkpoint of that name already.
	ErrExists = errors.New("checkpoint already exists")
	// ErrRolledBack: the call's box was rolled back to a checkpoint while
	// the call ran; what it was doing is gone with the state it ran in.
	ErrRolledBack = errors.New("box was rolled back")
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// CheckName checks a checkpoint name: 1 to MaxName letters, digits, '.',
// '_' or '-', starting with a letter or digit.
func CheckName(s string) error {
	if len(s) == 0 || len(s) > MaxName || !nameRE.MatchString(s) {
		return fmt.Errorf("checkpoint name %q: want 1-%d letters, digits, '.', '_' or '-', starting with a letter or digit", trim(s), MaxName)
	}
	return nil
}

// trim shortens a hostile name for an error message.
func trim(s string) string {
	if len(s) > MaxName+16 {
		return s[:MaxName+16] + "..."
	}
	return s
}

// Meta is the stored record of a checkpoint.
type Meta struct {
	Version int    `json:"v"`
	Name    string `json:"name"`
	// Parent is the checkpoint the box was at when this one was taken
	// (the last one taken or rolled back to), "" for a root.
	Parent  string    `json:"parent,omitempty"`
	Created time.Time `json:"created"`
	// StateBytes is the memory and device state on disk, DiskBytes the
	// writable layer's copy (bytes allocated), PausedNs how long the box
	// stood still while it was taken.
	StateBytes int64 `json:"state_bytes"`
	DiskBytes  int64 `json:"disk_bytes"`
	PausedNs   int64 `json:"paused_ns"`
	// AgentVersion is the guest agent's protocol version at the
	// checkpoint ("" in checkpoints taken before it was recorded).
	AgentVersion string `json:"agent_version,omitempty"`
}

// Info describes a checkpoint of a box (the root package's
// CheckpointInfo, Box.Checkpoint).
type Info struct {
	Name string
	// Parent is the checkpoint the box was at when this one was taken:
	// the last one taken or rolled back to ("" for a root).
	Parent  string
	Created time.Time
	// Current: the box was last checkpointed at or rolled back to it.
	Current bool
	// StateBytes is the memory and device state on disk, DiskBytes the
	// writable layer's copy (bytes allocated); Paused is how long the box
	// stood still while it was taken.
	StateBytes, DiskBytes int64
	Paused                time.Duration
}

// Info returns m as an Info; head is the tree's Head.
func (m Meta) Info(head string) Info {
	return Info{Name: m.Name, Parent: m.Parent, Created: m.Created, Current: m.Name == head,
		StateBytes: m.StateBytes, DiskBytes: m.DiskBytes, Paused: time.Duration(m.PausedNs)}
}

// Infos returns the box's checkpoints as Infos, oldest first.
func (t Tree) Infos() ([]Info, error) {
	list, err := t.List()
	head := t.Head()
	out := make([]Info, 0, len(list))
	for _, m := range list {
		out = append(out, m.Info(head))
	}
	return out, err
}

// Ended is the error of a call into the box that ended with err: when the
// box was rolled back since the call began at t0 (so that the rollback
// ended it), one wrapping ErrRolledBack that says so; else err.
func (t Tree) Ended(boxID string, t0 time.Time, err error) error {
	if to, at := t.LastRollback(); err != nil && at.After(t0) {
		return fmt.Errorf("box %s was rolled back to checkpoint %s while this ran (%v): %w", boxID, to, err, ErrRolledBack)
	}
	return err
}

// SwapLayer replaces the box's writable layer at path with what fill
// writes there (a checkpoint's copy): the old one is moved aside first and
// comes back if fill fails, so that the box always has one. A driver
// whose layer is not a file of its own passes "" (fill then does all).
func SwapLayer(path string, fill func() error) error {
	if path == "" {
		return fill()
	}
	old := path + ".old"
	if err := os.Rename(path, old); err != nil {
		return err
	}
	if err := fill(); err != nil {
		os.Remove(path)
		os.Rename(old, path)
		return err
	}
	return os.Remove(old)
}

// state is the box's position in its tree.
type state struct {
	Version int `json:"v"`
	// Head is the checkpoint the box was last checkpointed at or rolled
	// back to: the parent of the next one.
	Head string `json:"head,omitempty"`
	// RolledBackTo and RolledBackAt are the last rollback.
	RolledBackTo string    `json:"rolled_back_to,omitempty"`
	RolledBackAt time.Time `json:"rolled_back_at,omitempty"`
}

// Tree is the checkpoints of the box whose directory it was made for.
type Tree struct{ dir string }

// Of returns the checkpoint tree of the box in boxDir.
func Of(boxDir string) Tree { return Tree{dir: filepath.Join(boxDir, dirName)} }

// Path returns the directory of checkpoint name: the driver's snapshot
// files (for a restore).
func (t Tree) Path(name string) string { return filepath.Join(t.dir, name) }

// Get returns checkpoint name. Errors: ErrNotFound, a bad name, an
// unreadable record.
func (t Tree) Get(name string) (Meta, error) {
	var m Meta
	if err := CheckName(name); err != nil {
		return m, err
	}
	if err := readJSON(filepath.Join(t.dir, name, metaFile), &m); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return m, fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		return m, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	if m.Version != Version || m.Name != name {
		return m, fmt.Errorf("checkpoint %s: its record is of format %d for %q, not one this airlock reads", name, m.Version, trim(m.Name))
	}
	return m, nil
}

// List returns the box's checkpoints, oldest first; ones that cannot be
// read are left out. A box without checkpoints has none (no error).
func (t Tree) List() ([]Meta, error) {
	ents, err := os.ReadDir(t.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Meta
	for _, e := range ents {
		if !e.IsDir() || CheckName(e.Name()) != nil {
			continue
		}
		if m, err := t.Get(e.Name()); err == nil {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// Head returns the checkpoint the box was last checkpointed at or rolled
// back to ("" if none, or if it was removed since).
func (t Tree) Head() string {
	s := t.state()
	if s.Head == "" {
		return ""
	}
	if _, err := t.Get(s.Head); err != nil {
		return ""
	}
	return s.Head
}

// LastRollback returns the checkpoint of the box's last rollback and
// when it was done (zero if never).
func (t Tree) LastRollback() (name string, at time.Time) {
	s := t.state()
	return s.RolledBackTo, s.RolledBackAt
}

func (t Tree) state() state {
	var s state
	if err := readJSON(filepath.Join(t.dir, stateFile), &s); err != nil || s.Version != Version {
		return state{}
	}
	return s
}

func (t Tree) setState(s state) error {
	s.Version = Version
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return err
	}
	return writeJSON(filepath.Join(t.dir, stateFile), s)
}

// Create makes checkpoint name: save writes the driver's files into an
// empty temporary directory and returns the figures of the record; the
// record (with Parent the head) is written, the directory renamed into
// place, and the new checkpoint becomes the head. On error nothing is
// left. Errors: a bad name, ErrExists, more than MaxCheckpoints.
func (t Tree) Create(name string, save func(tmp string) (Meta, error)) (Meta, error) {
	var m Meta
	if err := CheckName(name); err != nil {
		return m, err
	}
	if _, err := os.Stat(t.Path(name)); err == nil {
		return m, fmt.Errorf("%w: %q: remove it first, or pick another name", ErrExists, name)
	}
	list, err := t.List()
	if err != nil {
		return m, err
	}
	if len(list) >= MaxCheckpoints {
		return m, fmt.Errorf("the box has %d checkpoints, the most it keeps: remove one first", len(list))
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return m, err
	}
	t.dropUnfinished()
	tmp, err := os.MkdirTemp(t.dir, tmpPrefix+name+"-")
	if err != nil {
		return m, err
	}
	defer os.RemoveAll(tmp) // gone by then on success
	if m, err = save(tmp); err != nil {
		return Meta{}, err
	}
	m.Version, m.Name, m.Parent = Version, name, t.Head()
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	if err := writeJSON(filepath.Join(tmp, metaFile), m); err != nil {
		return Meta{}, err
	}
	if err := os.Rename(tmp, t.Path(name)); err != nil {
		return Meta{}, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	s := t.state()
	s.Head = name
	if err := t.setState(s); err != nil {
		return m, fmt.Errorf("checkpoint %s: record it as the current one: %w", name, err)
	}
	return m, nil
}

// Adopt makes checkpoint m.Name of the whole snapshot directory src (on
// the same filesystem as the box's directory; it is moved), with m's
// parent, creation time, pause and agent version, for an imported box
// (airlock.ImportBox). The caller adopts parents first and has checked
// the tree (internal/boxarchive); m.Parent must be a checkpoint of the
// box already. It does not move the head (SetHead). Errors: a bad name,
// ErrExists, ErrNotFound for the parent, more than MaxCheckpoints.
func (t Tree) Adopt(m Meta, src string, stateBytes, diskBytes int64) error {
	if err := CheckName(m.Name); err != nil {
		return err
	}
	if m.Parent != "" {
		if _, err := t.Get(m.Parent); err != nil {
			return fmt.Errorf("checkpoint %s: its parent: %w", m.Name, err)
		}
	}
	if _, err := os.Stat(t.Path(m.Name)); err == nil {
		return fmt.Errorf("%w: %q", ErrExists, m.Name)
	}
	if list, err := t.List(); err != nil {
		return err
	} else if len(list) >= MaxCheckpoints {
		return fmt.Errorf("the box has %d checkpoints, the most it keeps", len(list))
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return err
	}
	m.Version, m.StateBytes, m.DiskBytes = Version, stateBytes, diskBytes
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	if err := writeJSON(filepath.Join(src, metaFile), m); err != nil {
		return err
	}
	if err := os.Rename(src, t.Path(m.Name)); err != nil {
		return fmt.Errorf("checkpoint %s: %w", m.Name, err)
	}
	return nil
}

// SetHead makes checkpoint name ("" none) the head: the checkpoint the
// box is at, the parent of its next one (an imported box's). Errors:
// ErrNotFound.
func (t Tree) SetHead(name string) error {
	if name != "" {
		if _, err := t.Get(name); err != nil {
			return err
		}
	}
	s := t.state()
	s.Head = name
	return t.setState(s)
}

// dropUnfinished removes what checkpoints cut short left (the caller
// holds the box's lock: none is being taken).
func (t Tree) dropUnfinished() {
	ents, _ := os.ReadDir(t.dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			os.RemoveAll(filepath.Join(t.dir, e.Name()))
		}
	}
}

// RolledBack records a rollback to checkpoint name, done at: it becomes
// the head, the parent of the next checkpoint (which so starts a branch).
func (t Tree) RolledBack(name string, at time.Time) error {
	s := t.state()
	s.Head, s.RolledBackTo, s.RolledBackAt = name, name, at.UTC()
	return t.setState(s)
}

// Remove deletes checkpoint name. It is safe for the checkpoints taken
// after it: those stored as deltas against it get the pages they took
// from it first (pagediff.Merge), and those whose parent it was get its
// parent instead (the tree stays connected);
// if it was the head, its parent becomes the head. Errors: ErrNotFound.
func (t Tree) Remove(name string) error {
	m, err := t.Get(name)
	if err != nil {
		return err
	}
	list, err := t.List()
	if err != nil {
		return err
	}
	// The checkpoints stored as deltas against it take the pages they
	// need from it first.
	var dirs []string
	for _, c := range list {
		if c.Name != name {
			dirs = append(dirs, t.Path(c.Name))
		}
	}
	if err := pagediff.Merge(t.Path(name), dirs, imageSize); err != nil {
		return fmt.Errorf("remove checkpoint %s: %w", name, err)
	}
	for _, c := range list {
		if c.Parent == name {
			c.Parent = m.Parent
			if err := writeJSON(filepath.Join(t.Path(c.Name), metaFile), c); err != nil {
				return fmt.Errorf("remove checkpoint %s: give checkpoint %s its parent: %w", name, c.Name, err)
			}
		}
	}
	if s := t.state(); s.Head == name {
		s.Head = m.Parent
		if err := t.setState(s); err != nil {
			return fmt.Errorf("remove checkpoint %s: %w", name, err)
		}
	}
	// Renamed first: a checkpoint is whole or not there.
	gone := filepath.Join(t.dir, fmt.Sprintf("%s%s-rm", tmpPrefix, name))
	if err := os.Rename(t.Path(name), gone); err != nil {
		return fmt.Errorf("remove checkpoint %s: %w", name, err)
	}
	return os.RemoveAll(gone)
}

// Flatten writes checkpoint name's driver files into the empty directory
// dst as a snapshot that needs no other checkpoint (what it stores as
// changes against its parents is filled in from them; the rest is
// hard-linked), for a restore outside the box (fork from a checkpoint).
// The caller holds the box's lock. Errors: ErrNotFound.
func (t Tree) Flatten(name, dst string) error {
	if _, err := t.Get(name); err != nil {
		return err
	}
	return pagediff.Flatten(t.Path(name), dst, func(n string) bool { return n != metaFile })
}

// Bytes returns the bytes the box's checkpoints take on disk (allocated),
// unfinished ones included.
func (t Tree) Bytes() int64 {
	var n int64
	filepath.WalkDir(t.dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					n += st.Blocks * 512
				}
			}
		}
		return nil
	})
	return n
}

// imageSize returns the size of image name of the checkpoint in dir (its
// file's; pagediff checks its sums against it).
func imageSize(dir, name string) (int64, error) {
	fi, err := os.Stat(filepath.Join(dir, name))
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func readJSON(path string, v any) error {
	b, err := boundedio.ReadFile(path, maxFile)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// writeJSON replaces path with v's JSON, by a rename.
func writeJSON(path string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Node is one line of a drawn tree (Draw).
type Node struct {
	Name, Parent string
}

// Draw returns the lines of the tree the nodes form, in the order given
// (oldest first): each child below its parent, indented with "├─ " and
// "└─ " as tree(1) draws; a node whose parent is not among them is a root.
func Draw(nodes []Node) []string {
	have := map[string]bool{}
	for _, n := range nodes {
		have[n.Name] = true
	}
	kids := map[string][]string{}
	var roots []string
	for _, n := range nodes {
		if n.Parent == "" || !have[n.Parent] || n.Parent == n.Name {
			roots = append(roots, n.Name)
		} else {
			kids[n.Parent] = append(kids[n.Parent], n.Name)
		}
	}
	var out []string
	seen := map[string]bool{}
	var walk func(name, prefix, lead string)
	walk = func(name, prefix, lead string) {
		if seen[name] { // a cycle in hostile records: drawn once
			return
		}
		seen[name] = true
		out = append(out, prefix+lead+name)
		next := prefix
		switch lead {
		case "├─ ":
			next += "│  "
		case "└─ ":
			next += "   "
		}
		for i, k := range kids[name] {
			l := "├─ "
			if i == len(kids[name])-1 {
				l = "└─ "
			}
			walk(k, next, l)
		}
	}
	for _, r := range roots {
		walk(r, "", "")
	}
	for _, n := range nodes { // in a cycle of hostile records
		walk(n.Name, "", "")
	}
	return out
}
