package airlock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseVolume(t *testing.T) {
	for spec, want := range map[string]Volume{
		"/srv/data:/data":    {Source: "/srv/data", Target: "/data"},
		"/srv/data:/data:ro": {Source: "/srv/data", Target: "/data", ReadOnly: true},
		"cache:/root/.cache": {Source: "cache", Target: "/root/.cache"},
		"cache:/c:rw":        {Source: "cache", Target: "/c"},
	} {
		if got, err := ParseVolume(spec); err != nil || got != want {
			t.Errorf("%q: %+v %v", spec, got, err)
		}
	}
	for _, bad := range []string{"/a", "/a:rel", "/a:/", "/a:/b:rx", "bad name:/x", "a:b:c:d"} {
		if _, err := ParseVolume(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := withDefaults(BoxOptions{Volumes: []Volume{{Source: "a", Target: "/x"}, {Source: "b", Target: "/x/"}}}); err == nil {
		t.Error("two volumes at one target accepted")
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
