// Package snapmeta is the on-disk form of a memory snapshot's record:
// Home/snapshots/NAME/snapshot.json (File), written last, so that a
// directory without it is an unfinished snapshot; the snapshot names; and
// the flock that keeps a snapshot while it is taken, restored or removed.
// The other files of a snapshot directory are the driver's (see
// internal/boxarchive's names).
package snapmeta

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gofrs/flock"

	"github.com/airlock-run/airlock/internal/scratch"
)

// Version is the format version of Meta; Read refuses another.
const Version = 1

// File is the name of a snapshot's record in its directory.
const File = "snapshot.json"

// maxFile bounds File's size (Read).
const maxFile = 1 << 20

// Errors (the root package's ErrSnapshotNotFound and ErrSnapshotExists).
var (
	// ErrNotFound: no snapshot has that name.
	ErrNotFound = errors.New("snapshot not found")
	// ErrExists: a snapshot of that name already exists.
	ErrExists = errors.New("snapshot already exists")
)

// Meta is the stored record of a snapshot.
type Meta struct {
	Version      int             `json:"v"`
	Name         string          `json:"name"`
	Box          string          `json:"box"`
	BoxName      string          `json:"box_name,omitempty"`
	Created      time.Time       `json:"created"`
	Image        string          `json:"image"`
	ImageDigest  string          `json:"image_digest"`
	Config       json.RawMessage `json:"config"` // the box's boxrecord.Record
	AgentVersion string          `json:"agent_version"`
	Driver       string          `json:"driver"`
	StateBytes   int64           `json:"state_bytes"`
	DiskBytes    int64           `json:"disk_bytes"`
	PausedNs     int64           `json:"paused_ns"`
}

var name = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ValidName reports whether s is a snapshot name (see CheckName).
func ValidName(s string) bool { return name.MatchString(s) }

// CheckName checks a snapshot name: 1-64 letters, digits, '.', '_' or
// '-', starting with a letter or digit.
func CheckName(s string) error {
	if !ValidName(s) {
		return fmt.Errorf("snapshot name %q: want 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", s)
	}
	return nil
}

// Read reads the record of snapshot name in dir (Home/snapshots).
// Errors: ErrNotFound; a bad name, a record over 1 MiB, unreadable or of
// another Version.
func Read(dir, name string) (Meta, error) {
	var m Meta
	if err := CheckName(name); err != nil {
		return m, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, name, File))
	if errors.Is(err, os.ErrNotExist) {
		return m, fmt.Errorf("%w: %q in %s", ErrNotFound, name, dir)
	}
	if err != nil {
		return m, err
	}
	if len(raw) > maxFile {
		return m, fmt.Errorf("snapshot %s: %s is larger than 1 MiB", name, File)
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("snapshot %s: %s: %w", name, File, err)
	}
	if m.Version != Version {
		return m, fmt.Errorf("snapshot %s: format version %d is not one this airlock reads (1)", name, m.Version)
	}
	return m, nil
}

// Load reads the record in snapshot directory snap as it is, unchecked (a
// snapshot being imported, whose record CheckArchived has checked).
func Load(snap string) (Meta, error) {
	var m Meta
	b, err := os.ReadFile(filepath.Join(snap, File))
	if err != nil {
		return m, err
	}
	err = json.Unmarshal(b, &m)
	return m, err
}

// Write writes m, indented, as the record of snapshot directory snap.
func Write(snap string, m Meta) error {
	raw, _ := json.MarshalIndent(m, "", "  ")
	return os.WriteFile(filepath.Join(snap, File), raw, 0o600)
}

// List returns the names of the snapshot directories in dir, as it lists
// them (none when dir does not exist); which of them hold a readable
// record is Read's to say.
func List(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && ValidName(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Make makes snapshot name in dir (Home/snapshots, created if missing),
// holding its exclusive lock: fill writes the snapshot's files into tmp,
// a new directory in dir labelled prefix+name (scratch.MkdirTemp), and
// returns its record, which Make writes last before it renames tmp to
// dir/name. A failed Make leaves no directory, and no lock file unless
// the snapshot exists. Errors: those of creating dir and of Lock, as they
// are; ErrExists, the text ending in "(hint)"; the others (fill's, and a
// failed write or rename) passed through wrap (nil: as they are).
func Make(ctx context.Context, dir, name, prefix, hint string, wrap func(error) error, fill func(tmp string) (Meta, error)) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	lk, err := Lock(ctx, dir, name, false)
	if err != nil {
		return err
	}
	defer lk.Unlock()
	final := filepath.Join(dir, name)
	if _, err := os.Stat(final); err == nil {
		return fmt.Errorf("%w: %q (%s)", ErrExists, name, hint)
	}
	err = func() error {
		tmp, err := scratch.MkdirTemp(dir, prefix+name)
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp) // gone after the rename, unless it failed
		m, err := fill(tmp)
		if err != nil {
			return err
		}
		if err := Write(tmp, m); err != nil {
			return err
		}
		return os.Rename(tmp, final)
	}()
	if err != nil {
		// No snapshot of that name: its lock file goes too (as a
		// removal's; a failed fork left one per try).
		os.Remove(lk.Path())
		if wrap != nil {
			err = wrap(err)
		}
		return err
	}
	return nil
}

// Lock takes the flock of snapshot name in dir, within ctx: shared while
// a box is restored from it or it is exported, exclusive while it is
// taken, imported or removed. The caller unlocks it, and removes its
// file (Path) when the snapshot is gone or was never made.
func Lock(ctx context.Context, dir, name string, shared bool) (*flock.Flock, error) {
	lk := flock.New(filepath.Join(dir, "."+name+".lock"))
	try := lk.TryLockContext
	if shared {
		try = lk.TryRLockContext
	}
	ok, err := try(ctx, 20*time.Millisecond)
	if err != nil {
		return nil, fmt.Errorf("lock snapshot %s: %w", name, err)
	}
	if !ok {
		return nil, fmt.Errorf("lock snapshot %s: %w", name, ctx.Err())
	}
	return lk, nil
}

// CheckArchived checks the record b of a snapshot in a box archive
// (hostile input): the fields kept from it (the agent version, the driver
// and the pause) must be ones a snapshot has.
func CheckArchived(b []byte) error {
	var sm Meta
	if err := json.Unmarshal(b, &sm); err != nil {
		return fmt.Errorf("archive's %s: %w", File, err)
	}
	if !printable(sm.AgentVersion, 64) || !printable(sm.Driver, 32) || sm.PausedNs < 0 {
		return fmt.Errorf("the archive's %s has an agent version %q, driver %q or pause %d ns that no snapshot has: not an archive Box.Export wrote", File, sm.AgentVersion, sm.Driver, sm.PausedNs)
	}
	return nil
}

// printable reports whether s is at most max bytes of printable text
// (spaces allowed; no control characters, no invalid UTF-8).
func printable(s string, max int) bool {
	if len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if !unicode.IsPrint(c) {
			return false
		}
	}
	return true
}

// OfImage returns the names of the snapshots in dir of boxes of image
// digest (snapshots that cannot be read are left out).
func OfImage(dir, digest string) []string {
	ms, _ := ReadAll(dir)
	var out []string
	for _, m := range ms {
		if m.ImageDigest == digest {
			out = append(out, m.Name)
		}
	}
	return out
}

// ReadAll returns the readable records of the snapshots in dir, in List's
// order; snapshots that cannot be read are left out.
func ReadAll(dir string) ([]Meta, error) {
	names, err := List(dir)
	if err != nil {
		return nil, err
	}
	var out []Meta
	for _, n := range names {
		if m, err := Read(dir, n); err == nil {
			out = append(out, m)
		}
	}
	return out, nil
}

// Remove deletes snapshot name of dir once no one holds it (Lock: a
// restore, an export in progress is waited for), its lock file last.
// Errors: ErrNotFound.
func Remove(ctx context.Context, dir, name string) error {
	if _, err := Read(dir, name); err != nil {
		return err
	}
	lk, err := Lock(ctx, dir, name, false)
	if err != nil {
		return err
	}
	defer func() {
		lk.Unlock()
		os.Remove(lk.Path())
	}()
	return os.RemoveAll(filepath.Join(dir, name))
}

// TempName is a new name for a snapshot made for a while (an export's,
// a fork's): prefix, "-" and 8 random hex digits.
func TempName(prefix string) string {
	var rnd [4]byte
	rand.Read(rnd[:])
	return prefix + "-" + hex.EncodeToString(rnd[:])
}
