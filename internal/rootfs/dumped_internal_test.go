package rootfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHostileGuestDumpedFiles: what a (confined, possibly taken over)
// debugfs leaves in its directory is read only as a regular file of its
// own: a symlink to a host file, a fifo or a hard link is refused, and
// nothing blocks.
func TestHostileGuestDumpedFiles(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("host secret"), 0o600)
	os.WriteFile(filepath.Join(dir, "ok"), []byte("value"), 0o600)
	os.WriteFile(filepath.Join(dir, "big"), make([]byte, 100), 0o600)
	os.Symlink(secret, filepath.Join(dir, "link"))
	os.Link(filepath.Join(dir, "big"), filepath.Join(dir, "hard"))
	unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600)
	if b, err := readDumped(filepath.Join(dir, "ok"), 64); err != nil || string(b) != "value" {
		t.Errorf("regular file: %q %v", b, err)
	}
	for _, n := range []string{"link", "hard", "fifo", "big", "missing"} {
		if b, err := readDumped(filepath.Join(dir, n), 64); err == nil {
			t.Errorf("%s read: %q", n, b)
		}
	}
}
