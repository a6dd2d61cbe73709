//go:build linux

package tarfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func mkTree(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "src", "empty"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "src", "sub"), 0o750))
	must(os.WriteFile(filepath.Join(dir, "src", "sub", "a.txt"), []byte("hello"), 0o640))
	must(os.Link(filepath.Join(dir, "src", "sub", "a.txt"), filepath.Join(dir, "src", "hard")))
	must(os.Symlink("sub/a.txt", filepath.Join(dir, "src", "link")))
	must(os.Symlink("/etc", filepath.Join(dir, "src", "abs")))
	must(os.WriteFile(filepath.Join(dir, "src", "caf\xe9-\xff"), []byte("latin1"), 0o600))
	must(os.WriteFile(filepath.Join(dir, "src", "exe"), []byte("#!/bin/sh\n"), 0o755))
	mt := time.Date(2001, 2, 3, 4, 5, 6, 789000000, time.UTC)
	must(os.Chtimes(filepath.Join(dir, "src", "exe"), mt, mt))
}

func TestArchiveExtractRoundTrip(t *testing.T) {
	dir := t.TempDir()
	mkTree(t, dir)
	src, err := OpenRoot(dir, InRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var buf bytes.Buffer
	var top Info
	if err := src.Archive("/src", &buf, ArchiveOptions{}, func(i Info) error { top = i; return nil }); err != nil {
		t.Fatal(err)
	}
	if !top.Mode.IsDir() || top.Name != "src" {
		t.Fatalf("top %+v", top)
	}
	out := t.TempDir()
	dst, err := OpenRoot(out, Beneath)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := dst.Extract(".", &buf, ExtractOptions{RenameFrom: "src", RenameTo: "copy", UID: -1, GID: -1}); err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(out, "copy")
	if b, err := os.ReadFile(filepath.Join(c, "sub", "a.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("a.txt: %q %v", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(c, "caf\xe9-\xff")); string(b) != "latin1" {
		t.Errorf("non-UTF-8 name: %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(c, "link")); l != "sub/a.txt" {
		t.Errorf("link -> %q", l)
	}
	if l, _ := os.Readlink(filepath.Join(c, "abs")); l != "/etc" {
		t.Errorf("abs -> %q", l)
	}
	var s1, s2 syscall.Stat_t
	syscall.Stat(filepath.Join(c, "sub", "a.txt"), &s1)
	syscall.Stat(filepath.Join(c, "hard"), &s2)
	if s1.Ino != s2.Ino || s1.Nlink != 2 {
		t.Errorf("hard link lost: %d %d nlink %d", s1.Ino, s2.Ino, s1.Nlink)
	}
	if fi, err := os.Stat(filepath.Join(c, "empty")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
		t.Errorf("empty dir: %v %v", fi, err)
	}
	if fi, _ := os.Stat(filepath.Join(c, "sub")); fi.Mode().Perm() != 0o750 {
		t.Errorf("sub mode %v", fi.Mode())
	}
	fi, _ := os.Stat(filepath.Join(c, "exe"))
	if fi.Mode().Perm() != 0o755 || !fi.ModTime().Equal(time.Date(2001, 2, 3, 4, 5, 6, 789000000, time.UTC)) {
		t.Errorf("exe: %v %v", fi.Mode(), fi.ModTime())
	}
	ents, _ := os.ReadDir(c)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".airlock-tmp") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

// hostile builds an archive by hand, as a hostile guest could send it.
func hostile(t *testing.T, entries ...tar.Header) *bytes.Buffer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h.Format = tar.FormatPAX
		if h.Typeflag == tar.TypeReg {
			h.Size = 4
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("evil"))
		}
	}
	tw.Close()
	return &buf
}

func TestExtractRefusesEscapes(t *testing.T) {
	cases := map[string][]tar.Header{
		"symlink to /etc then write through it": {
			{Name: "x", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "x/passwd", Typeflag: tar.TypeReg, Mode: 0o644},
		},
		"symlink up then write through it": {
			{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../.."},
			{Name: "up/owned", Typeflag: tar.TypeReg, Mode: 0o644},
		},
		"dotdot entry":      {{Name: "../owned", Typeflag: tar.TypeReg, Mode: 0o644}},
		"deep dotdot entry": {{Name: "a/../../owned", Typeflag: tar.TypeReg, Mode: 0o644}},
		"absolute entry":    {{Name: "/tmp/owned", Typeflag: tar.TypeReg, Mode: 0o644}},
		"hard link outside": {{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside"}},
		"hard link through symlink": {
			{Name: "x", Typeflag: tar.TypeSymlink, Linkname: ".."},
			{Name: "h", Typeflag: tar.TypeLink, Linkname: "x/outside"},
		},
		"device node": {{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666}},
	}
	for name, ents := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			os.WriteFile(filepath.Join(parent, "outside"), []byte("keep"), 0o644)
			dest := filepath.Join(parent, "dest")
			os.Mkdir(dest, 0o755)
			r, err := OpenRoot(dest, Beneath)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			_, err = r.Extract(".", hostile(t, ents...), ExtractOptions{UID: -1, GID: -1})
			if err == nil {
				t.Fatal("hostile archive extracted without error")
			}
			ents, _ := os.ReadDir(parent)
			if len(ents) != 2 {
				t.Errorf("destination's parent changed: %v", ents)
			}
			if b, _ := os.ReadFile(filepath.Join(parent, "outside")); string(b) != "keep" {
				t.Errorf("outside file changed: %q", b)
			}
			filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
				if d != nil && d.Type().IsRegular() {
					t.Errorf("file written: %s", p)
				}
				return nil
			})
		})
	}
}

func TestExtractClearsSetuid(t *testing.T) {
	dest := t.TempDir()
	r, _ := OpenRoot(dest, Beneath)
	defer r.Close()
	if _, err := r.Extract(".", hostile(t, tar.Header{Name: "su", Typeflag: tar.TypeReg, Mode: 0o4755}), ExtractOptions{UID: -1, GID: -1}); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dest, "su"))
	if fi.Mode()&fs.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v", fi.Mode())
	}
}

func TestInRootClampsSymlinks(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(root, "esc"))
	os.Symlink("../../../..", filepath.Join(root, "up"))
	r, _ := OpenRoot(root, InRoot)
	defer r.Close()
	// Both land inside root: /esc -> <root>/<outside path>, /up -> /.
	if _, err := r.WriteFile("/up/f", strings.NewReader("x"), 0o644, -1, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "f")); err != nil {
		t.Errorf("write through /up did not land at the root: %v", err)
	}
	_, err := r.WriteFile("/esc/f", strings.NewReader("x"), 0o644, -1, -1)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("write through absolute symlink: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "f")); err == nil {
		t.Error("escaped the root")
	}
}

func TestArchiveOfRootRenamed(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	src, _ := OpenRoot(dir, InRoot)
	defer src.Close()
	var buf bytes.Buffer
	var top Info
	if err := src.Archive("/", &buf, ArchiveOptions{}, func(i Info) error { top = i; return nil }); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	dst, _ := OpenRoot(out, Beneath)
	defer dst.Close()
	if _, err := dst.Extract(".", &buf, ExtractOptions{RenameFrom: top.Name, RenameTo: "copy", UID: -1, GID: -1}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "copy", "f")); err != nil || string(b) != "x" {
		t.Fatalf("%q %v (top %q)", b, err, top.Name)
	}
}

// With a rename set (a copy of one tree, as CopyOut makes), entries
// outside the top entry are refused with an error naming them, whatever
// the rename, and nothing is written outside the renamed tree: a hostile
// guest answering `cp BOX:/out ~` with out/x plus .bashrc or
// .ssh/authorized_keys replaces no host file and chmods no directory.
func TestHostileAgentArchiveOutsideItsTop(t *testing.T) {
	evil := func(t *testing.T) *bytes.Buffer {
		return hostile(t,
			tar.Header{Name: "out", Typeflag: tar.TypeDir, Mode: 0o755},
			tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644},
			tar.Header{Name: ".ssh", Typeflag: tar.TypeDir, Mode: 0o777},
			tar.Header{Name: ".ssh/authorized_keys", Typeflag: tar.TypeReg, Mode: 0o644},
			tar.Header{Name: ".bashrc", Typeflag: tar.TypeReg, Mode: 0o644},
		)
	}
	for _, to := range []string{"", "out", "new", "."} {
		t.Run("to="+to, func(t *testing.T) {
			home := t.TempDir()
			os.Mkdir(filepath.Join(home, ".ssh"), 0o700)
			os.WriteFile(filepath.Join(home, ".ssh", "authorized_keys"), []byte("mine"), 0o600)
			os.WriteFile(filepath.Join(home, ".bashrc"), []byte("mine"), 0o644)
			r, err := OpenRoot(home, Beneath)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			dir := "."
			if to == "." {
				os.Mkdir(filepath.Join(home, "dest"), 0o755)
				dir = "dest"
			}
			_, err = r.Extract(dir, evil(t), ExtractOptions{RenameFrom: "out", RenameTo: to, UID: -1, GID: -1})
			if err == nil || !strings.Contains(err.Error(), `".ssh"`) {
				t.Fatalf("err = %v, want a refusal naming .ssh", err)
			}
			for _, f := range []string{".bashrc", ".ssh/authorized_keys"} {
				if b, _ := os.ReadFile(filepath.Join(home, f)); string(b) != "mine" {
					t.Errorf("%s replaced: %q", f, b)
				}
			}
			if fi, _ := os.Stat(filepath.Join(home, ".ssh")); fi.Mode().Perm() != 0o700 {
				t.Errorf(".ssh chmodded to %v", fi.Mode().Perm())
			}
		})
	}
	// A hard link to a host file outside the top is refused too.
	home := t.TempDir()
	os.WriteFile(filepath.Join(home, ".bashrc"), []byte("mine"), 0o644)
	r, err := OpenRoot(home, Beneath)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = r.Extract(".", hostile(t,
		tar.Header{Name: "out", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "out/rc", Typeflag: tar.TypeLink, Linkname: ".bashrc"},
	), ExtractOptions{RenameFrom: "out", RenameTo: "out", UID: -1, GID: -1})
	if err == nil || !strings.Contains(err.Error(), ".bashrc") {
		t.Fatalf("hard link out of the top: err = %v", err)
	}
	if _, err := os.Lstat(filepath.Join(home, "out", "rc")); err == nil {
		t.Error("hard link to a file outside the top was made")
	}
}

// FuzzExtractFromGuest extracts arbitrary bytes as a tar stream from a
// guest (a copy-out of "out" into home/new): whatever it holds, nothing
// outside home/new is created, replaced or changed, and nothing is left
// at all when the extraction fails.
func FuzzExtractFromGuest(f *testing.F) {
	add := func(entries ...tar.Header) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			h.Format = tar.FormatPAX
			if h.Typeflag == tar.TypeReg {
				h.Size = 4
			}
			tw.WriteHeader(&h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("evil"))
			}
		}
		tw.Close()
		f.Add(buf.Bytes())
	}
	add(tar.Header{Name: "out", Typeflag: tar.TypeDir, Mode: 0o755}, tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644})
	add(tar.Header{Name: "out/x", Typeflag: tar.TypeReg}, tar.Header{Name: ".bashrc", Typeflag: tar.TypeReg})
	add(tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: ".."}, tar.Header{Name: "out/.bashrc", Typeflag: tar.TypeReg})
	add(tar.Header{Name: "out/l", Typeflag: tar.TypeSymlink, Linkname: "/"}, tar.Header{Name: "out/l/x", Typeflag: tar.TypeReg})
	add(tar.Header{Name: "out/h", Typeflag: tar.TypeLink, Linkname: "keep"})
	add(tar.Header{Name: "out/../keep", Typeflag: tar.TypeReg})
	add(tar.Header{Name: "/keep", Typeflag: tar.TypeReg})
	add(tar.Header{Name: "out/./../keep", Typeflag: tar.TypeReg})
	add(tar.Header{Name: "out", Typeflag: tar.TypeDir, Mode: 0o7777}, tar.Header{Name: ".", Typeflag: tar.TypeDir, Mode: 0o777})
	add(tar.Header{Name: "out/d", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3})
	f.Add([]byte("not a tar stream"))
	f.Fuzz(func(t *testing.T, data []byte) {
		home := t.TempDir()
		keep := filepath.Join(home, "keep")
		if err := os.WriteFile(keep, []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chmod(home, 0o700)
		r, err := OpenRoot(home, Beneath)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		_, xerr := r.Extract(".", bytes.NewReader(data), ExtractOptions{RenameFrom: "out", RenameTo: "new", UID: -1, GID: -1, MaxBytes: 1 << 20, MaxEntries: 1000})
		ents, _ := os.ReadDir(home)
		for _, e := range ents {
			if e.Name() != "keep" && (e.Name() != "new" || xerr != nil) {
				t.Errorf("left %s in home (extract: %v)", e.Name(), xerr)
			}
		}
		if b, err := os.ReadFile(keep); err != nil || string(b) != "mine" {
			t.Errorf("keep changed: %q %v", b, err)
		}
		if fi, err := os.Stat(home); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("home's mode changed: %v", fi.Mode())
		}
		var st syscall.Stat_t
		if syscall.Stat(keep, &st) == nil && st.Nlink != 1 {
			t.Errorf("keep has %d links", st.Nlink)
		}
		os.RemoveAll(filepath.Join(home, "new"))
	})
}
