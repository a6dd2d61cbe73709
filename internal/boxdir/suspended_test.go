package boxdir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
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
