package airlock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The rules of `docker cp` (docs.docker.com/reference/cli/docker/container/cp).
func TestCpTarget(t *testing.T) {
	cases := []struct {
		src            string
		srcDir         bool
		dst            string
		exists, dstDir bool
		want           target
		wantErr        bool
	}{
		{"f", false, "/new", false, false, target{"/", "new"}, false},
		{"f", false, "/new/", false, false, target{}, true},
		{"f", false, "/file", true, false, target{"/", "file"}, false},
		{"f", false, "/dir", true, true, target{"/dir", ""}, false},
		{"f", false, "/dir/", true, true, target{"/dir", ""}, false},
		{"f", false, "/file/", true, false, target{}, true},
		{"f/", false, "/dir", true, true, target{}, true},
		{"d", true, "/new", false, false, target{"/", "new"}, false},
		{"d", true, "/a/new/", false, false, target{"/a", "new"}, false},
		{"d", true, "/file", true, false, target{}, true},
		{"d", true, "/dir", true, true, target{"/dir", ""}, false},
		{"d/.", true, "/dir", true, true, target{"/dir", "."}, false},
		{"d/.", true, "/new", false, false, target{"/", "new"}, false},
		{"d/", true, "/dir", true, true, target{"/dir", ""}, false},
		{"f", false, "rel/x", false, false, target{"rel", "x"}, false},
	}
	for _, c := range cases {
		got, err := cpTarget(c.src, c.srcDir, c.dst, c.exists, c.dstDir)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("cp %s (dir %v) -> %s (exists %v dir %v): got %+v %v, want %+v err %v", c.src, c.srcDir, c.dst, c.exists, c.dstDir, got, err, c.want, c.wantErr)
		}
	}
}

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
	if err := checkVolumes([]Volume{{Source: "a", Target: "/x"}, {Source: "b", Target: "/x/"}}); err == nil {
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
