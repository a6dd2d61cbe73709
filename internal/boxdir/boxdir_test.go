package boxdir

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

// A box directory too long for socket paths puts its sockets in a private
// short directory, which PrepareSockDir makes 0700 and refuses when another
// user could have planted it.
func TestPrepareSockDirForLongBoxDirs(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	id := "0123456789ab"
	short := t.TempDir()
	if err := PrepareSockDir(short, id, QMP, AgentSock(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ShortDir(id)); !os.IsNotExist(err) {
		t.Fatalf("short dir made for a short box dir: %v", err)
	}
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if p := SockPath(long, id, QMP); filepath.Dir(p) != ShortDir(id) {
		t.Fatalf("SockPath = %s, want it in %s", p, ShortDir(id))
	}
	if err := PrepareSockDir(long, id, QMP, AgentSock(3)); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(ShortDir(id)), ShortDir(id)} {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v", d, fi, err)
		}
	}
	os.Chmod(ShortDir(id), 0o777)
	if err := PrepareSockDir(long, id, QMP); err == nil || !strings.Contains(err.Error(), "open to other users") {
		t.Fatalf("world-writable short dir: %v", err)
	}
}
