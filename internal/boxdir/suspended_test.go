package boxdir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSuspendedStateIsWholeOrAbsent: a saved state exists only once its
// save returned, and a drop takes it away before deleting it.
func TestSuspendedStateIsWholeOrAbsent(t *testing.T) {
	dir := t.TempDir()
	if SuspendedIn(dir) != "" {
		t.Fatal("an empty box directory is suspended")
	}
	_, err := SaveSuspended(dir, func(tmp string) error {
		os.WriteFile(filepath.Join(tmp, "state"), []byte("half"), 0o600)
		return errors.New("save failed")
	})
	if err == nil || SuspendedIn(dir) != "" {
		t.Fatalf("failed save: %v, suspended %q", err, SuspendedIn(dir))
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a failed save left %v", ents)
	}
	final, err := SaveSuspended(dir, func(tmp string) error {
		return os.WriteFile(filepath.Join(tmp, "state"), []byte("whole"), 0o600)
	})
	if err != nil || SuspendedIn(dir) != final {
		t.Fatalf("save: %v, suspended %q, want %q", err, SuspendedIn(dir), final)
	}
	if b, _ := os.ReadFile(filepath.Join(final, "state")); string(b) != "whole" {
		t.Errorf("saved state holds %q", b)
	}
	DropSuspended(final)
	if ents, _ := os.ReadDir(dir); SuspendedIn(dir) != "" || len(ents) != 0 {
		t.Errorf("after the drop: suspended %q, left %v", SuspendedIn(dir), ents)
	}
}

// TestLockBoxIsExclusive: a second taker waits until the first releases,
// or its context ends.
func TestLockBoxIsExclusive(t *testing.T) {
	dir := t.TempDir()
	unlock, err := LockBox(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := LockBox(ctx, dir); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second lock: %v, want the context's deadline", err)
	}
	unlock()
	unlock2, err := LockBox(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
	os.WriteFile(filepath.Join(dir, "x"), nil, 0o600)
	if err := RemoveBox(dir); err != nil || SuspendedIn(dir) != "" {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("box directory still there: %v", err)
	}
}

func TestMakeParentIsOwnerOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "boxes")
	os.Mkdir(dir, 0o755)
	if err := MakeParent(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("mode %v (%v), want 0700", fi.Mode(), err)
	}
}
