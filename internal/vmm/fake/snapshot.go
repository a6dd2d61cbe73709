package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/sparse"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Snapshotting is the FAKE driver with the optional abilities of the QEMU
// driver: snapshots (vmm.Snapshotter) and pause (vmm.Pauser), so that the
// lifecycle code's snapshot, restore, fork, pause, suspend and pool
// template logic runs without a VM. Driver alone has neither (the
// lifecycle code's ErrNotSupported paths, a pool that boots its boxes).
//
// What it models, and how:
//   - A box's writable layer is a host directory, FilesDir(spec.Dir),
//     that the box's commands (host processes) can write to; Create makes
//     it empty, and it survives Stop/Start as a disk does.
//   - Pause stops the agent process and every process it started
//     (SIGSTOP, repeated until no new one appears); Resume continues them
//     (SIGCONT). A paused machine's agent answers nothing, as a paused VM's.
//   - A snapshot is a copy of the writable layer, taken while the machine
//     is paused (so that no command writes meanwhile), and a description
//     of the machine (CPUs, memory, the agent binary) that a restore must
//     match. A restore copies the layer into the new box and starts a
//     fresh agent: unlike QEMU's, it has none of the snapshot's processes
//     or memory (it cannot save them), only its files.
type Snapshotting struct {
	*Driver
}

var _ vmm.Snapshotter = (*Snapshotting)(nil)
var _ vmm.Pauser = (*Snapshotting)(nil)

// NewSnapshotting returns a fake driver with snapshots and pause, running
// the agent binary at agent.
func NewSnapshotting(agent string) *Snapshotting { return &Snapshotting{New(agent)} }

// Files of the fake in a box directory and a snapshot directory.
const (
	filesDir     = "fake-files"   // the writable layer
	machineFile  = "machine.json" // a snapshot's machine (fakeMachine)
	snapshotVers = 1
)

// FilesDir returns the fake's writable layer of the box in boxDir: a host
// directory of its own, which its commands can write to and snapshots copy.
func FilesDir(boxDir string) string { return filepath.Join(boxDir, filesDir) }

// fakeMachine is what a fake snapshot records of its machine; a restore
// must match it (as QEMU's must match the snapshot's machine layout and
// boot files).
type fakeMachine struct {
	Version   int       `json:"v"`
	CPUs      int       `json:"cpus"`
	MemoryMiB int       `json:"memory_mib"`
	Agent     agentFile `json:"agent"`
}

// agentFile identifies the agent binary a machine ran (as the QEMU driver
// identifies its boot files: the same local file, unchanged).
type agentFile struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	ModNs int64  `json:"mod_ns"`
}

func (d *Driver) agentFile() (agentFile, error) {
	fi, err := os.Stat(d.Agent)
	if err != nil {
		return agentFile{}, fmt.Errorf("fake driver: agent binary: %w", err)
	}
	return agentFile{Path: d.Agent, Size: fi.Size(), ModNs: fi.ModTime().UnixNano()}, nil
}

// SaveSnapshot pauses the machine (unless it was paused already: then it
// stays paused), copies the box's writable layer into dir, records the
// machine there and lets the machine run on. StateBytes is the size of the
// machine record, DiskBytes what the copy allocates.
func (s *Snapshotting) SaveSnapshot(ctx context.Context, spec vmm.Spec, h vmm.Handle, dir string, _ vmm.SaveOptions) (vmm.SnapshotStats, error) {
	var st vmm.SnapshotStats
	if !h.Alive() {
		return st, fmt.Errorf("fake driver: agent process %d is gone", h.PID)
	}
	af, err := s.agentFile()
	if err != nil {
		return st, err
	}
	raw, _ := json.Marshal(fakeMachine{Version: snapshotVers, CPUs: spec.CPUs, MemoryMiB: spec.MemoryMiB, Agent: af})
	was, err := paused(h)
	if err != nil {
		return st, err
	}
	t0 := time.Now()
	if !was {
		if err := pause(h); err != nil {
			return st, err
		}
		defer resume(h)
	}
	if err := copyTree(FilesDir(spec.Dir), filepath.Join(dir, filesDir)); err != nil {
		return st, fmt.Errorf("fake driver: copy the writable layer: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, machineFile), raw, 0o600); err != nil {
		return st, err
	}
	st.PausedNs = int64(time.Since(t0))
	st.StateBytes = int64(len(raw))
	st.DiskBytes = sparse.AllocatedTree(filepath.Join(dir, filesDir))
	return st, nil
}

// CheckSnapshot checks that the snapshot in dir is complete and that its
// machine is spec's with this driver's agent binary, unchanged.
func (s *Snapshotting) CheckSnapshot(spec vmm.Spec, dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, machineFile))
	if err != nil {
		return fmt.Errorf("fake driver: snapshot %s is incomplete: %w", dir, err)
	}
	var m fakeMachine
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("fake driver: snapshot %s: %s: %w", dir, machineFile, err)
	}
	if m.Version != snapshotVers {
		return fmt.Errorf("fake driver: snapshot %s: version %d, want %d", dir, m.Version, snapshotVers)
	}
	if fi, err := os.Stat(filepath.Join(dir, filesDir)); err != nil || !fi.IsDir() {
		return fmt.Errorf("fake driver: snapshot %s is incomplete: no writable layer", dir)
	}
	if m.CPUs != spec.CPUs || m.MemoryMiB != spec.MemoryMiB {
		return fmt.Errorf("fake driver: the snapshot's machine has %d CPUs and %d MiB, the box %d and %d: the snapshot cannot be restored for it",
			m.CPUs, m.MemoryMiB, spec.CPUs, spec.MemoryMiB)
	}
	af, err := s.agentFile()
	if err != nil {
		return err
	}
	if af != m.Agent {
		return fmt.Errorf("fake driver: the snapshot's agent %s was built again or replaced (now %s): the snapshot cannot be restored", m.Agent.Path, af.Path)
	}
	return nil
}

// CreateFromSnapshot checks the snapshot and copies its writable layer
// into the new box's directory.
func (s *Snapshotting) CreateFromSnapshot(ctx context.Context, spec vmm.Spec, dir string) error {
	if err := s.CheckSnapshot(spec, dir); err != nil {
		return err
	}
	dst := FilesDir(spec.Dir)
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if err := copyTree(filepath.Join(dir, filesDir), dst); err != nil {
		return fmt.Errorf("fake driver: copy the snapshot's writable layer: %w", err)
	}
	return nil
}

// StartFromSnapshot checks the snapshot and starts a fresh agent for spec
// (see Snapshotting: the snapshot's processes are not restored). It reads
// nothing from dir after it returns.
func (s *Snapshotting) StartFromSnapshot(ctx context.Context, spec vmm.Spec, dir string) (vmm.Machine, error) {
	if err := s.CheckSnapshot(spec, dir); err != nil {
		return nil, err
	}
	return s.Start(ctx, spec)
}

// Pause stops the machine's agent and every process it started.
func (s *Snapshotting) Pause(ctx context.Context, spec vmm.Spec, h vmm.Handle) error {
	if !h.Alive() {
		return fmt.Errorf("fake driver: agent process %d is gone", h.PID)
	}
	return pause(h)
}

// Resume continues a paused machine; a running one is left as it is.
func (s *Snapshotting) Resume(ctx context.Context, spec vmm.Spec, h vmm.Handle) error {
	if !h.Alive() {
		return fmt.Errorf("fake driver: agent process %d is gone", h.PID)
	}
	resume(h)
	return nil
}

// Paused reports whether the machine's agent is stopped.
func (s *Snapshotting) Paused(ctx context.Context, spec vmm.Spec, h vmm.Handle) (bool, error) {
	if !h.Alive() {
		return false, fmt.Errorf("fake driver: agent process %d is gone", h.PID)
	}
	return paused(h)
}

// pause sends SIGSTOP to the agent of h, then to each process it started,
// until a pass finds no new one (a process may fork until it is stopped),
// and waits until the agent is stopped.
func pause(h vmm.Handle) error {
	if err := unix.Kill(h.PID, unix.SIGSTOP); err != nil {
		return fmt.Errorf("fake driver: pause: %w", err)
	}
	stopped := map[int]bool{h.PID: true}
	for {
		more := false
		for _, p := range descendants(h.PID) {
			if !stopped[p] {
				unix.Kill(p, unix.SIGSTOP)
				stopped[p], more = true, true
			}
		}
		if !more {
			break
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if p, err := paused(h); err != nil || p {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fake driver: agent process %d did not stop", h.PID)
		}
	}
}

// resume sends SIGCONT to the processes the agent of h started and to
// the agent.
func resume(h vmm.Handle) {
	for _, p := range descendants(h.PID) {
		unix.Kill(p, unix.SIGCONT)
	}
	unix.Kill(h.PID, unix.SIGCONT)
}

// paused reports whether the process of h is stopped (state T).
func paused(h vmm.Handle) (bool, error) {
	st, _, err := procStat(h.PID)
	if err != nil || !h.Alive() {
		return false, fmt.Errorf("fake driver: agent process %d is gone", h.PID)
	}
	return st == "T", nil
}

// procStat returns the state and parent pid of process pid (fields 3 and
// 4 of /proc/PID/stat).
func procStat(pid int) (state string, ppid int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return "", 0, errors.New("malformed stat")
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0], ppid, nil
}

// descendants returns the processes below pid, parents first, from one
// scan of /proc.
func descendants(pid int) []int {
	kids := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, pp, err := procStat(p); err == nil {
			kids[pp] = append(kids[pp], p)
		}
	}
	var out []int
	for q := []int{pid}; len(q) > 0; q = q[1:] {
		for _, k := range kids[q[0]] {
			out = append(out, k)
			q = append(q, k)
		}
	}
	return out
}

// copyTree copies directory src to dst (which must not exist): regular
// files, directories and symbolic links, with their modes.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		fi, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case e.IsDir():
			err = os.Mkdir(to, fi.Mode().Perm()|0o700)
		case e.Type()&fs.ModeSymlink != 0:
			var l string
			if l, err = os.Readlink(p); err == nil {
				err = os.Symlink(l, to)
			}
		case e.Type().IsRegular():
			err = sparse.CopyFile(p, to, fi.Mode().Perm())
		default:
			return nil // sockets, fifos, devices: not on a disk of the fake
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); err == nil && ok && os.Geteuid() == 0 {
			err = os.Lchown(to, int(st.Uid), int(st.Gid)) // a box user's files stay theirs
		}
		return err
	})
}
