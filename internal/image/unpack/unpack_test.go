package unpack_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/image/unpack"
)

type E = imagetest.Entry

func apply(t *testing.T, root string, entries ...E) error {
	t.Helper()
	return unpack.Apply(context.Background(), root, bytes.NewReader(imagetest.Tar(t, entries...)), unpack.Options{Note: func(m string) { t.Log("note: " + m) }})
}

func mustApply(t *testing.T, root string, entries ...E) {
	t.Helper()
	if err := apply(t, root, entries...); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// baseLayer and topLayer are the two layers of the end-to-end test image.
func baseLayer(t *testing.T) []byte {
	return imagetest.Tar(t,
		E{Name: "./"},
		E{Name: "etc/"},
		E{Name: "etc/deleted", Body: "gone"},
		E{Name: "etc/kept", Body: "kept"},
		E{Name: "opq/"},
		E{Name: "opq/old1", Body: "1"},
		E{Name: "opq/sub/"},
		E{Name: "opq/sub/old2", Body: "2"},
		E{Name: "usr/"},
		E{Name: "usr/bin/"},
		E{Name: "usr/bin/su", Body: "#!/bin/sh\n", Mode: 0o4755},
		E{Name: "usr/lib/"},
		E{Name: "lib", Type: tar.TypeSymlink, Linkname: "usr/lib"},
		E{Name: "home/"},
		E{Name: "home/user/", Uid: 1000, Gid: 1000, Mode: 0o700},
		E{Name: "home/user/.profile", Body: "x", Uid: 1000, Gid: 1000, ModTime: time.Unix(1600000000, 0)},
		E{Name: "dev/"},
		E{Name: "dev/null", Type: tar.TypeChar, Devmajor: 1, Devminor: 3},
		E{Name: "run/"},
		E{Name: "run/fifo", Type: tar.TypeFifo, Mode: 0o600},
	)
}

func topLayer(t *testing.T) []byte {
	return imagetest.Tar(t,
		E{Name: "etc/.wh.deleted"},
		E{Name: "opq/"},
		E{Name: "opq/.wh..wh..opq"},
		E{Name: "opq/new", Body: "new"},
		E{Name: "etc/kept-link", Type: tar.TypeLink, Linkname: "etc/kept"},
		E{Name: "etc/sym", Type: tar.TypeSymlink, Linkname: "kept"},
		E{Name: "lib/libx.so", Body: "elf"}, // through the lib -> usr/lib symlink
		E{Name: "etc/cap", Body: "c", Xattrs: map[string]string{"user.test": "v"}},
	)
}

func checkTree(t *testing.T, root string) {
	t.Helper()
	if exists(filepath.Join(root, "etc/deleted")) {
		t.Errorf("whiteout did not delete etc/deleted")
	}
	if got := readFile(t, filepath.Join(root, "etc/kept")); got != "kept" {
		t.Errorf("etc/kept = %q", got)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "opq"))
	if len(ents) != 1 || ents[0].Name() != "new" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("opaque dir holds %v, want [new]", names)
	}
	a, _ := os.Stat(filepath.Join(root, "etc/kept"))
	b, err := os.Stat(filepath.Join(root, "etc/kept-link"))
	if err != nil || !os.SameFile(a, b) {
		t.Errorf("etc/kept-link is not a hard link of etc/kept: %v", err)
	}
	if l, err := os.Readlink(filepath.Join(root, "etc/sym")); err != nil || l != "kept" {
		t.Errorf("etc/sym -> %q, %v", l, err)
	}
	if got := readFile(t, filepath.Join(root, "usr/lib/libx.so")); got != "elf" {
		t.Errorf("write through symlinked parent: %q", got)
	}
	if fi, err := os.Lstat(filepath.Join(root, "lib")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("lib is no longer a symlink: %v", err)
	}
	fi, err := os.Stat(filepath.Join(root, "usr/bin/su"))
	if err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("usr/bin/su mode = %v, %v; want setuid 0755", fi.Mode(), err)
	}
	fi, err = os.Lstat(filepath.Join(root, "home/user/.profile"))
	if err != nil || !fi.ModTime().Equal(time.Unix(1600000000, 0)) {
		t.Errorf(".profile mtime = %v, %v", fi.ModTime(), err)
	}
	if os.Geteuid() == 0 {
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf(".profile owner = %d:%d, want 1000:1000", st.Uid, st.Gid)
		}
	}
	fi, err = os.Lstat(filepath.Join(root, "home/user"))
	if err != nil || fi.Mode().Perm() != 0o700 || !fi.ModTime().Equal(time.Unix(1700000000, 0)) {
		t.Errorf("home/user = %v %v, %v", fi.Mode(), fi.ModTime(), err)
	}
	if exists(filepath.Join(root, "dev/null")) {
		t.Errorf("device node was created")
	}
	if fi, err := os.Lstat(filepath.Join(root, "run/fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("run/fifo = %v", err)
	}
}

func TestApplyLayers(t *testing.T) {
	root := t.TempDir()
	for _, l := range [][]byte{baseLayer(t), topLayer(t)} {
		if err := unpack.Apply(context.Background(), root, bytes.NewReader(l), unpack.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	checkTree(t, root)
}

// TestPullAndUnpack pushes a two-layer image to a loopback registry, pulls
// it and unpacks it.
func TestPullAndUnpack(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	ref := reg.Push(t, "test/tree:v1", imagetest.Image(t, []string{"sh"}, baseLayer(t), topLayer(t)))
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.Pull(context.Background(), ref, image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	var notes []string
	if err := unpack.Image(context.Background(), s, img, root, unpack.Options{Note: func(m string) { notes = append(notes, m) }}); err != nil {
		t.Fatal(err)
	}
	checkTree(t, root)
	if len(notes) != 1 || !strings.Contains(notes[0], "dev/null") {
		t.Errorf("notes = %q, want one about dev/null", notes)
	}
}

func TestHostileLayers(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("original"), 0o644)
	for _, tc := range []struct {
		name    string
		entries []E
		refused bool // must fail with ErrUnsafePath
	}{
		{"dotdot", []E{{Name: "../victim", Body: "pwned"}}, true},
		{"nested dotdot", []E{{Name: "a/../../victim", Body: "pwned"}}, true},
		{"absolute", []E{{Name: victim, Body: "pwned"}}, true},
		{"hardlink out", []E{{Name: "h", Type: tar.TypeLink, Linkname: "../victim"}}, true},
		{"hardlink absolute", []E{{Name: "h", Type: tar.TypeLink, Linkname: victim}}, true},
		{"whiteout dotdot", []E{{Name: "../.wh.victim"}}, true},
		// Symlinks are created, but writing through them stays in the root.
		{"symlinked parent", []E{
			{Name: "esc", Type: tar.TypeSymlink, Linkname: outside},
			{Name: "esc/victim", Body: "pwned"},
		}, false},
		{"relative symlinked parent", []E{
			{Name: "esc", Type: tar.TypeSymlink, Linkname: "../../../../../../" + outside},
			{Name: "esc/victim", Body: "pwned"},
		}, false},
		{"symlink then file on it", []E{
			{Name: "victim-link", Type: tar.TypeSymlink, Linkname: victim},
			{Name: "victim-link", Body: "pwned"},
		}, false},
		{"whiteout through symlink", []E{
			{Name: "esc", Type: tar.TypeSymlink, Linkname: outside},
			{Name: "esc/.wh.victim"},
		}, false},
		{"opaque through symlink", []E{
			{Name: "esc", Type: tar.TypeSymlink, Linkname: outside},
			{Name: "esc/.wh..wh..opq"},
		}, false},
		{"hardlink through symlink", []E{
			{Name: "esc", Type: tar.TypeSymlink, Linkname: outside},
			{Name: "h", Type: tar.TypeLink, Linkname: "esc/victim"},
		}, false},
		{"dir through symlink", []E{
			{Name: "esc", Type: tar.TypeSymlink, Linkname: outside},
			{Name: "esc/newdir/"},
			{Name: "esc/newdir/f", Body: "x"},
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			err := apply(t, root, tc.entries...)
			if tc.refused && !errors.Is(err, unpack.ErrUnsafePath) {
				t.Errorf("err = %v, want ErrUnsafePath", err)
			}
			if !tc.refused && err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Logf("err = %v", err)
			}
			if got := readFile(t, victim); got != "original" {
				t.Fatalf("hostile layer wrote outside the root: victim = %q", got)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Fatalf("hostile layer changed the outside dir: %d entries", len(ents))
			}
		})
	}
}

func TestWhiteoutOrderInLayer(t *testing.T) {
	root := t.TempDir()
	mustApply(t, root, E{Name: "d/"}, E{Name: "d/old", Body: "o"}, E{Name: "f", Body: "file"})
	// The opaque marker after this layer's own entries must keep them;
	// replacing a file with a directory and back works.
	mustApply(t, root,
		E{Name: "d/"}, E{Name: "d/new", Body: "n"}, E{Name: "d/.wh..wh..opq"},
		E{Name: "f/"}, E{Name: "f/inner", Body: "i"},
	)
	if exists(filepath.Join(root, "d/old")) || !exists(filepath.Join(root, "d/new")) {
		t.Errorf("opaque after entries: old=%v new=%v", exists(filepath.Join(root, "d/old")), exists(filepath.Join(root, "d/new")))
	}
	if readFile(t, filepath.Join(root, "f/inner")) != "i" {
		t.Errorf("file -> dir replacement failed")
	}
	mustApply(t, root, E{Name: "f", Body: "file again"})
	if readFile(t, filepath.Join(root, "f")) != "file again" {
		t.Errorf("dir -> file replacement failed")
	}
}
