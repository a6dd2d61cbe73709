//go:build linux

package guestinit

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// rewrite leaves exactly the new content, whether the file held less, as
// much or more (a box may have appended to its /etc/hosts).
func TestRewriteReplacesContent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "hosts")
	for _, c := range []struct{ before, after string }{
		{"127.0.1.1\tabcdef\n", "127.0.1.1\tuvwxyz\n"},
		{"127.0.1.1\tabc\n", "127.0.1.1\tlonger-name\n"},
		{"127.0.1.1\tlonger-name\n10.0.0.9\tadded-by-the-box\n", "127.0.1.1\tx\n"},
	} {
		if err := os.WriteFile(p, []byte(c.before), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := rewrite(p, []byte(c.after)); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != c.after {
			t.Fatalf("after rewrite of %q with %q: %q", c.before, c.after, b)
		}
	}
	if err := rewrite(filepath.Join(t.TempDir(), "missing"), []byte("x")); err == nil {
		t.Fatal("rewrite of a missing file did not fail")
	}
}

// An image whose /etc/hosts or /etc/hostname is a symlink to a file
// outside the box root (absolute, or climbing out with ..), or whose /etc
// is one, cannot make the agent write outside the box root: the link is
// replaced by a regular file, or the box's /etc resolves inside the root.
func TestHostileGuestEtcSymlinksStayInBoxRoot(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	for _, c := range []struct {
		name  string
		setup func(root string)
	}{
		{"absolute link", func(root string) { os.Symlink(victim, filepath.Join(root, "etc/hosts")) }},
		{"relative link climbing out", func(root string) {
			rel, _ := filepath.Rel(filepath.Join(root, "etc"), victim)
			os.Symlink(rel, filepath.Join(root, "etc/hosts"))
		}},
		{"dangling link to a new file", func(root string) {
			os.Remove(victim)
			os.Symlink(victim, filepath.Join(root, "etc/hosts"))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			os.Mkdir(filepath.Join(root, "etc"), 0o755)
			if c.name != "dangling link to a new file" {
				os.WriteFile(victim, []byte("host data\n"), 0o644)
			}
			c.setup(root)
			etc, err := openEtc(root)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(etc)
			if err := createEtcFile(etc, "hosts", []byte("127.0.1.1\tbox\n")); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(victim); c.name == "dangling link to a new file" && err == nil {
				t.Fatalf("a file was created outside the box root through a dangling link: %q", b)
			} else if c.name != "dangling link to a new file" && string(b) != "host data\n" {
				t.Fatalf("the file outside the box root became %q", b)
			}
			fi, err := os.Lstat(filepath.Join(root, "etc/hosts"))
			if err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("/etc/hosts in the box is not a regular file: %v %v", fi, err)
			}
			if b, _ := os.ReadFile(filepath.Join(root, "etc/hosts")); string(b) != "127.0.1.1\tbox\n" {
				t.Fatalf("/etc/hosts in the box: %q", b)
			}
		})
	}
	// /etc itself a link out of the box: resolved inside the root (where
	// that path does not exist), never to the host-side directory.
	t.Run("etc a link out", func(t *testing.T) {
		root := t.TempDir()
		os.Symlink(outside, filepath.Join(root, "etc"))
		if etc, err := openEtc(root); err == nil {
			createEtcFile(etc, "hostname", []byte("box\n"))
			unix.Close(etc)
		}
		if _, err := os.Stat(filepath.Join(outside, "hostname")); err == nil {
			t.Fatal("hostname written into the directory /etc links to outside the box root")
		}
		// ... and one that stays inside the root is followed.
		root = t.TempDir()
		os.MkdirAll(filepath.Join(root, "usr/etc"), 0o755)
		os.Symlink("/usr/etc", filepath.Join(root, "etc"))
		etc, err := openEtc(root)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(etc)
		if err := createEtcFile(etc, "hostname", []byte("box\n")); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(root, "usr/etc/hostname")); string(b) != "box\n" {
			t.Fatalf("hostname through an in-root /etc link: %q", b)
		}
	})
}
