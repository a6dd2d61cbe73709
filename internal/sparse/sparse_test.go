package sparse_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/airlock-run/airlock/internal/sparse"
)

// TestCopyKeepsHoles: a copy reads the same as its source, takes no more
// space than the source's data (its holes stay holes), and never
// overwrites a file.
func TestCopyKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	data := bytes.Repeat([]byte("airlock!"), 8192) // 64 KiB
	for _, off := range []int64{0, 16 << 20, size - int64(len(data))} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := sparse.Copy(src, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatalf("the copy (%d bytes) differs from its source (%d bytes)", len(b), len(a))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 4<<20 {
		t.Errorf("the copy of %d MiB holding 192 KiB of data takes %d KiB: its holes were filled", size>>20, used>>10)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o600 {
		t.Errorf("the copy has mode %v, want 0600", fi.Mode().Perm())
	}
	if err := sparse.Copy(src, dst); !errors.Is(err, fs.ErrExist) {
		t.Errorf("a copy onto an existing file: %v, want it refused (fs.ErrExist)", err)
	}
	if err := sparse.Copy(filepath.Join(dir, "missing"), filepath.Join(dir, "dst2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a copy of a missing file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "dst2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed copy left its destination: %v", err)
	}
}

func TestCopyFileIsNewWithItsMode(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	os.WriteFile(src, []byte("content"), 0o600)
	if err := sparse.CopyFile(src, dst, 0o640); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(dst)
	fi, err := os.Stat(dst)
	if err != nil || string(b) != "content" || fi.Mode().Perm()&^0o022 != 0o640&^0o022 {
		t.Errorf("copy: %q, %v %v", b, fi.Mode(), err)
	}
	if err := sparse.CopyFile(src, dst, 0o640); !errors.Is(err, os.ErrExist) {
		t.Errorf("copy over an existing file: %v", err)
	}
}
