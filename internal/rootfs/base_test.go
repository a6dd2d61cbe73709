package rootfs_test

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/rootfs"
)

type E = imagetest.Entry

// trickyImage has the cases a rootfs base must get right: whiteouts,
// opaque directories, hard links within and across layers, symlinks
// (short, absolute, long, in parent paths), FIFOs, setuid bits, owners,
// xattrs, file sizes around the block size, a directory spanning several
// blocks, and names sorting before "." and "..".
func trickyImage(t *testing.T) (*image.Store, *image.Image) {
	t.Helper()
	mt := time.Unix(1700000000, 123456789)
	var big []E
	for i := 0; i < 600; i++ {
		big = append(big, E{Name: fmt.Sprintf("big/%s-%03d", strings.Repeat("n", i%40), i), Body: fmt.Sprint(i)})
	}
	body := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + n)
		}
		return string(b)
	}
	l1 := append([]E{
		{Name: "./", Mode: 0o755},
		{Name: "etc/"},
		{Name: "etc/gone", Body: "x"},
		{Name: "etc/keep", Body: "keep"},
		{Name: "opq/"},
		{Name: "opq/a", Body: "a"},
		{Name: "opq/sub/"},
		{Name: "opq/sub/b", Body: "b"},
		{Name: "sizes/"},
		{Name: "sizes/0"},
		{Name: "sizes/1", Body: body(1)},
		{Name: "sizes/2048", Body: body(2048)},
		{Name: "sizes/2049", Body: body(2049)},
		{Name: "sizes/4095", Body: body(4095)},
		{Name: "sizes/4096", Body: body(4096)},
		{Name: "sizes/4097", Body: body(4097)},
		{Name: "sizes/100000", Body: body(100000)},
		{Name: "sizes/replaced", Body: body(50000)},
		{Name: "links/"},
		{Name: "links/src", Body: "src", Uid: 1000, Gid: 1001, Mode: 0o640},
		{Name: "bin/"},
		{Name: "bin/su", Body: "su", Mode: 0o4755},
		{Name: "bin/dirsgid/", Mode: 0o2775},
		{Name: "tmp/", Mode: 0o1777},
		{Name: "fifo", Type: tar.TypeFifo, Mode: 0o600},
		{Name: "dev/"},
		{Name: "dev/null", Type: tar.TypeChar, Devmajor: 1, Devminor: 3},
		{Name: "x/", Xattrs: map[string]string{"user.dir": "d"}},
		{Name: "x/attr", Body: "x", Xattrs: map[string]string{"user.one": "1", "security.two": "22", "trusted.skip": "no"}},
		{Name: "sym/"},
		{Name: "sym/rel", Type: tar.TypeSymlink, Linkname: "../etc/keep"},
		{Name: "sym/abs", Type: tar.TypeSymlink, Linkname: "/etc/keep"},
		{Name: "sym/long", Type: tar.TypeSymlink, Linkname: strings.Repeat("l/", 1500) + "end"},
		{Name: "sym/dir", Type: tar.TypeSymlink, Linkname: "/opq"},
		{Name: "sym/out", Type: tar.TypeSymlink, Linkname: "../../../../elsewhere"},
		{Name: "!sorts-first", Body: "!"},
		{Name: "-dash", Body: "-"},
		{Name: "mtimes/", ModTime: mt},
		{Name: "mtimes/f", Body: "f", ModTime: mt},
		// 254, not NAME_MAX (255): mkfs.erofs 1.5 (bookworm) fails with
		// "Could not format the device: [Error 2]" on a 255-byte name.
		{Name: strings.Repeat("L", 254), Body: "long name"},
	}, big...)
	l2 := []E{
		{Name: "etc/.wh.gone"},
		{Name: "opq/"},
		{Name: "opq/.wh..wh..opq"},
		{Name: "opq/new", Body: "new"},
		{Name: "links/hard", Type: tar.TypeLink, Linkname: "links/src"},
		{Name: "links/same", Body: "same"},
		{Name: "links/same2", Type: tar.TypeLink, Linkname: "links/same"},
		{Name: "sizes/replaced", Body: "short now"},
		{Name: "sym/dir/through", Body: "written through a symlink"},
		{Name: "sym/out/contained", Body: "stays inside"},
		{Name: "big/.wh.-000"},
		{Name: "etc/", Mode: 0o700, Uid: 5, Gid: 6},
	}
	reg := imagetest.NewRegistry(t)
	ref := reg.Push(t, "test/tricky:v1", imagetest.Image(t, []string{"/bin/sh"}, imagetest.Tar(t, l1...), imagetest.Tar(t, l2...)))
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.Pull(context.Background(), ref, image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s, img
}

// TestErofsMatchesUnpack builds a base with rootfs.BaseWith and checks
// that, mounted (or extracted by fsck.erofs), it holds exactly the tree
// package unpack makes from the same layers, plus InitLayer's files: types, modes, owners, sizes,
// content, symlink targets, hard links, xattrs and file mtimes.
func TestErofsMatchesUnpack(t *testing.T) {
	s, img := trickyImage(t)
	compareWithUnpack(t, s, img)
}

// TestErofsDefaultImage does the same for the default python:slim image of
// the shared store. It takes a while: set AIRLOCK_TEST_EROFS_FULL=1.
func TestErofsDefaultImage(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_EROFS_FULL") != "1" {
		t.Skip("set AIRLOCK_TEST_EROFS_FULL=1 to compare the default image")
	}
	s, err := image.Open(defaults.Images())
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.Resolve("python:slim")
	if err != nil {
		t.Skip(err)
	}
	compareWithUnpack(t, s, img)
}

func compareWithUnpack(t *testing.T, s *image.Store, img *image.Image) {
	t.Helper()
	ctx := context.Background()
	var notes []string
	p, err := rootfs.BaseWith(ctx, s, img, t.TempDir(), rootfs.BaseOptions{Note: func(m string) { notes = append(notes, m) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("fsck.erofs"); err == nil {
		if b, err := exec.Command("fsck.erofs", p).CombinedOutput(); err != nil {
			t.Fatalf("fsck.erofs: %v\n%s", err, b)
		}
	}
	got, how := mountOrExtract(t, p)
	want := filepath.Join(t.TempDir(), "root")
	os.Mkdir(want, 0o755)
	if err := unpack.Image(ctx, s, img, want, unpack.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := rootfs.InitLayer(want); err != nil {
		t.Fatal(err)
	}
	a, b := describeTree(t, want, how == "mount"), describeTree(t, got, how == "mount")
	var diffs []string
	for k, v := range a {
		if b[k] != v {
			diffs = append(diffs, fmt.Sprintf("%s:\n  unpack: %s\n  erofs:  %s", k, v, b[k]))
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: only in erofs: %s", k, v))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		if len(diffs) > 30 {
			diffs = append(diffs[:30], fmt.Sprintf("... %d more", len(diffs)-30))
		}
		t.Errorf("erofs (%s) differs from unpack in %d entries of %d:\n%s", how, len(diffs), len(a), strings.Join(diffs, "\n"))
	}
	t.Logf("compared %d entries (%s); notes: %q", len(a), how, notes)
}

// mountOrExtract mounts the image read-only (root with loop devices), or
// extracts it with fsck.erofs.
func mountOrExtract(t *testing.T, p string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		if err := exec.Command("mount", "-t", "erofs", "-o", "loop,ro", p, dir).Run(); err == nil {
			t.Cleanup(func() { exec.Command("umount", dir).Run() })
			return dir, "mount"
		}
	}
	if _, err := exec.LookPath("fsck.erofs"); err != nil {
		t.Skip("cannot mount erofs here and fsck.erofs is not installed")
	}
	if b, err := exec.Command("fsck.erofs", "--extract="+dir, "--overwrite", p).CombinedOutput(); err != nil {
		t.Fatalf("fsck.erofs --extract: %v\n%s", err, b)
	}
	return dir, "fsck.erofs --extract"
}

// describeTree maps each path under root to a description of its
// metadata and content. Hard links are described by the set of names
// sharing the inode; with full, directory sizes aside, times and xattrs
// are included too.
func describeTree(t *testing.T, root string, full bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	links := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode=%o uid=%d gid=%d", st.Mode, st.Uid, st.Gid)
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			io.Copy(h, f)
			f.Close()
			desc += fmt.Sprintf(" size=%d sha=%s nlink=%d", st.Size, hex.EncodeToString(h.Sum(nil))[:12], st.Nlink)
			if full {
				desc += fmt.Sprintf(" mtime=%d.%09d", st.Mtim.Sec, st.Mtim.Nsec)
			}
			if st.Nlink > 1 {
				links[st.Ino] = append(links[st.Ino], rel)
			}
		case syscall.S_IFLNK:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case syscall.S_IFDIR:
			if full && rel != "." {
				desc += fmt.Sprintf(" nlink=%d", st.Nlink)
			}
		}
		if full {
			desc += " xattrs=" + xattrs(p)
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, names := range links {
		sort.Strings(names)
		for _, n := range names {
			out[n] += " links=" + strings.Join(names, ",")
		}
	}
	return out
}

func xattrs(p string) string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return "-"
		}
		return err.Error()
	}
	names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
	sort.Strings(names)
	var parts []string
	for _, name := range names {
		if name == "" {
			continue
		}
		v := make([]byte, 4096)
		m, _ := unix.Lgetxattr(p, name, v)
		parts = append(parts, name+"="+string(v[:max(m, 0)]))
	}
	return strings.Join(parts, ";")
}

// TestErofsRefusesEscapes checks that Base refuses names that climb out of
// the root with unpack.ErrUnsafePath.
func TestErofsRefusesEscapes(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	for i, l := range [][]E{
		{{Name: "../escape", Body: "x"}},
		{{Name: "/abs", Body: "x"}},
		{{Name: "h", Type: tar.TypeLink, Linkname: "../x"}},
		{{Name: "../.wh.x"}},
	} {
		ref := reg.Push(t, fmt.Sprintf("test/esc:%d", i), imagetest.Image(t, nil, imagetest.Tar(t, l...)))
		s, err := image.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		img, err := s.Pull(context.Background(), ref, image.PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rootfs.Base(context.Background(), s, img, t.TempDir()); !errors.Is(err, unpack.ErrUnsafePath) {
			t.Errorf("layer %v: Base = %v, want ErrUnsafePath", l, err)
		}
	}
}

// TestErofsCancel checks that a cancelled build fails and leaves nothing
// behind.
func TestErofsCancel(t *testing.T) {
	s, img := trickyImage(t)
	cache := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancelled halfway through the first layer, at its device node.
	if _, err := rootfs.BaseWith(ctx, s, img, cache, rootfs.BaseOptions{Note: func(string) { cancel() }}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Base with a cancelled context: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(cache, "rootfs"))
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// TestErofsReproducible builds the base of one image in two cache
// directories, a second apart: the same bytes (a memory snapshot restored
// on another host needs its base to be the exporting host's).
func TestErofsReproducible(t *testing.T) {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skip("mkfs.erofs not installed")
	}
	s, img := trickyImage(t)
	var sums, paths []string
	for i := 0; i < 2; i++ {
		if i == 1 {
			time.Sleep(1100 * time.Millisecond) // another build time, if it showed
		}
		p, err := rootfs.Base(context.Background(), s, img, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		sums = append(sums, hex.EncodeToString(h[:]))
		paths = append(paths, p)
	}
	if sums[0] != sums[1] {
		out, _ := exec.Command("cmp", "-l", paths[0], paths[1]).Output()
		if len(out) > 2000 {
			out = out[:2000]
		}
		t.Errorf("two builds of the same base differ: %s, %s; differing bytes (offset, octal values):\n%s", sums[0], sums[1], out)
	}
}
