package boxdir

import (
	"os"
	"path/filepath"
)

// The saved state of a box paused to disk (Suspended): complete whenever
// it exists, because SaveSuspended renames it into place last and
// DropSuspended renames it away first.

// SuspendedIn returns where the box in dir keeps its saved state, ""
// when it is not suspended.
func SuspendedIn(dir string) string {
	p := filepath.Join(dir, Suspended)
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		return ""
	}
	return p
}

// SaveSuspended makes the saved state of the box in dir: save writes it
// into a new temporary directory, which is renamed into place once save
// has returned nil; otherwise (or when the rename fails) it is removed.
// It returns the saved state's directory.
func SaveSuspended(dir string, save func(tmp string) error) (string, error) {
	final := filepath.Join(dir, Suspended)
	tmp := final + ".tmp"
	os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // gone after the rename, unless it failed
	if err := save(tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", err
	}
	return final, nil
}

// DropSuspended deletes a saved state directory (SuspendedIn's): renamed
// away first, so that a deletion cut short leaves no part of it behind as
// a saved state.
func DropSuspended(p string) {
	gone := p + ".drop"
	os.RemoveAll(gone)
	if os.Rename(p, gone) == nil {
		p = gone
	}
	os.RemoveAll(p)
}

// MakeParent makes dir, the directory box directories are in
// (Home/boxes), if missing, and makes it the owner's only: box
// directories hold disks and sockets (homes made by older versions had
// 0755).
func MakeParent(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}
