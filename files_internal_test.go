package airlock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPrivateDirRefusesOthersDirs(t *testing.T) {
	base := t.TempDir()
	own := filepath.Join(base, "own")
	if err := privateDir(own); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(own); fi.Mode().Perm() != 0o700 {
		t.Fatalf("made with mode %o", fi.Mode().Perm())
	}
	if err := privateDir(own); err != nil {
		t.Fatalf("own 0700 directory refused: %v", err)
	}
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o755)
	os.Chmod(open, 0o755)
	if err := privateDir(open); err == nil || !strings.Contains(err.Error(), "open to other users") {
		t.Errorf("0755 directory: %v", err)
	}
	link := filepath.Join(base, "link")
	os.Symlink(own, link)
	if err := privateDir(link); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("symlink: %v", err)
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		os.Mkdir(other, 0o700)
		os.Chown(other, 65534, 65534)
		if err := privateDir(other); err == nil || !strings.Contains(err.Error(), "another user") {
			t.Errorf("directory of uid 65534: %v", err)
		}
	}
}

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
