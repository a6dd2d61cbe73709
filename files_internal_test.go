package airlock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNoHomeIsAClearError(t *testing.T) {
	t.Setenv("HOME", "")
	t.Setenv("AIRLOCK_HOME", "")
	_, err := Open(Options{})
	if err == nil || !strings.Contains(err.Error(), "AIRLOCK_HOME") {
		t.Fatalf("Open without HOME: %v", err)
	}
	t.Setenv("AIRLOCK_HOME", t.TempDir())
	t.Setenv("AIRLOCK_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "")
	_, err = Open(Options{})
	if err == nil || !strings.Contains(err.Error(), "AIRLOCK_CACHE") {
		t.Fatalf("Open without a cache dir: %v", err)
	}
}

func TestStateDBAndBoxesArePrivate(t *testing.T) {
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, "boxes"), 0o755)
	os.Chmod(filepath.Join(home, "boxes"), 0o755)
	r, err := Open(Options{Home: home, CacheDir: t.TempDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, p := range []string{"state.db", "state.db-wal", "state.db-shm", "boxes"} {
		fi, err := os.Stat(filepath.Join(home, p))
		if os.IsNotExist(err) && p != "state.db" && p != "boxes" {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %o", p, fi.Mode().Perm())
		}
	}
}
