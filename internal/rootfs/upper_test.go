package rootfs_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/rootfs"
)

// upperDisk makes an ext4 image whose /upper holds what an overlayfs upper
// directory holds: files, a hard link, symlinks (fast and slow), a
// whiteout and an opaque directory. It needs root (mknod, trusted.*
// xattrs) and mkfs.ext4 -d.
func upperDisk(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make whiteouts (mknod) and trusted.* xattrs")
	}
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("no debugfs (e2fsprogs)")
	}
	src := filepath.Join(t.TempDir(), "src")
	up := filepath.Join(src, "upper")
	for _, d := range []string{"dir/sub", "opq", "../work"} {
		if err := os.MkdirAll(filepath.Join(up, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(up, "dir/a.txt"), []byte("hello\n"), 0o640))
	must(os.Chown(filepath.Join(up, "dir/a.txt"), 1000, 1001))
	must(os.Link(filepath.Join(up, "dir/a.txt"), filepath.Join(up, "dir/hard")))
	must(os.Symlink("a.txt", filepath.Join(up, "dir/lnk")))
	long := string(bytes.Repeat([]byte("x"), 100))
	must(os.Symlink(long, filepath.Join(up, "longlnk")))
	must(unix.Mknod(filepath.Join(up, "gone"), unix.S_IFCHR|0o644, 0))
	must(unix.Setxattr(filepath.Join(up, "opq"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(up, "opq/new"), []byte("n"), 0o644))
	must(unix.Mkfifo(filepath.Join(up, "fifo"), 0o644))
	must(unix.Setxattr(filepath.Join(up, "dir/a.txt"), "user.note", []byte("kept"), 0))
	must(unix.Setxattr(filepath.Join(up, "opq/new"), "security.capability", capNetRaw, 0))
	must(unix.Setxattr(filepath.Join(up, "opq/new"), "trusted.secret", []byte("x"), 0))
	disk := filepath.Join(t.TempDir(), "rw.ext4")
	must(os.WriteFile(disk, nil, 0o600))
	must(os.Truncate(disk, 32<<20))
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", src, disk).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 -d: %v: %s", err, out)
	}
	return disk
}

// capNetRaw is a VFS_CAP_REVISION_2 security.capability value granting
// CAP_NET_RAW (bit 13), as setcap cap_net_raw+ep writes it.
var capNetRaw = []byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

func TestUpperLayer(t *testing.T) {
	disk := upperDisk(t)
	var buf bytes.Buffer
	st, err := rootfs.UpperLayer(context.Background(), disk, t.TempDir(), &buf, unpack.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*tar.Header{}
	body := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
		b, _ := io.ReadAll(tr)
		body[h.Name] = string(b)
	}
	want := map[string]byte{
		"dir/": tar.TypeDir, "dir/sub/": tar.TypeDir, "opq/": tar.TypeDir, "opq/.wh..wh..opq": tar.TypeReg,
		"opq/new": tar.TypeReg, ".wh.gone": tar.TypeReg, "dir/lnk": tar.TypeSymlink, "longlnk": tar.TypeSymlink,
	}
	for name, typ := range want {
		h := got[name]
		if h == nil || h.Typeflag != typ {
			t.Errorf("entry %s: got %+v, want type %c", name, h, typ)
		}
	}
	// The first name of the hard-linked inode is the file, the other a link to it.
	a, hard := got["dir/a.txt"], got["dir/hard"]
	if a == nil || hard == nil {
		t.Fatalf("hard-linked pair missing: %v %v", a, hard)
	}
	if a.Typeflag == tar.TypeLink {
		a, hard = hard, a
	}
	if a.Typeflag != tar.TypeReg || body[a.Name] != "hello\n" || a.Uid != 1000 || a.Gid != 1001 || a.Mode != 0o640 {
		t.Errorf("file: %+v %q", a, body[a.Name])
	}
	if hard.Typeflag != tar.TypeLink || hard.Linkname != a.Name {
		t.Errorf("hard link: %+v", hard)
	}
	if v := a.PAXRecords["SCHILY.xattr.user.note"]; v != "kept" {
		t.Errorf("user.note of %s = %q", a.Name, v)
	}
	n := got["opq/new"]
	if v := n.PAXRecords["SCHILY.xattr.security.capability"]; v != string(capNetRaw) {
		t.Errorf("security.capability = %q", v)
	}
	if _, ok := n.PAXRecords["SCHILY.xattr.trusted.secret"]; ok {
		t.Error("a trusted.* attribute was carried")
	}
	if got["dir/lnk"].Linkname != "a.txt" || len(got["longlnk"].Linkname) != 100 {
		t.Errorf("symlinks: %q %q", got["dir/lnk"].Linkname, got["longlnk"].Linkname)
	}
	if _, ok := got["fifo"]; ok || len(st.Skipped) != 1 {
		t.Errorf("fifo: kept %v, skipped %v", ok, st.Skipped)
	}
	if _, ok := got["work/"]; ok {
		t.Error("the overlay work directory leaked into the layer")
	}
	if st.Whiteouts != 2 {
		t.Errorf("whiteouts = %d, want 2", st.Whiteouts)
	}

	// Limits hold.
	_, err = rootfs.UpperLayer(context.Background(), disk, t.TempDir(), io.Discard, unpack.Limits{MaxFileSize: 3})
	if !errors.Is(err, unpack.ErrLimit) {
		t.Errorf("a 6-byte file under a 3-byte limit: %v", err)
	}
	_, err = rootfs.UpperLayer(context.Background(), disk, t.TempDir(), io.Discard, unpack.Limits{MaxEntries: 4})
	if !errors.Is(err, unpack.ErrLimit) {
		t.Errorf("12 entries under a limit of 4: %v", err)
	}
}

func TestUpperLayerEmptyDisk(t *testing.T) {
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("no debugfs (e2fsprogs)")
	}
	disk := filepath.Join(t.TempDir(), "rw.ext4")
	if err := rootfs.NewDisk(disk, 16, ""); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	st, err := rootfs.UpperLayer(context.Background(), disk, t.TempDir(), &buf, unpack.Limits{})
	if err != nil || st.Entries != 0 {
		t.Fatalf("disk of a box that never booted: %+v %v", st, err)
	}
	if _, err := tar.NewReader(&buf).Next(); err != io.EOF {
		t.Errorf("want an empty tar, got %v", err)
	}
}
