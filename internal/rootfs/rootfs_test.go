package rootfs_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/rootfs"
)

func requireTool(t *testing.T, name, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not found (install %s)", name, pkg)
	}
}

func testStoreImage(t *testing.T) (*image.Store, *image.Image) {
	reg := imagetest.NewRegistry(t)
	base := imagetest.Tar(t,
		imagetest.Entry{Name: "bin/"},
		imagetest.Entry{Name: "bin/hello", Body: "#!/bin/sh\necho hi\n", Mode: 0o755},
		imagetest.Entry{Name: "etc/"},
		imagetest.Entry{Name: "etc/gone", Body: "x"},
		imagetest.Entry{Name: "home/"},
		imagetest.Entry{Name: "home/u/", Uid: 1000, Gid: 1000},
	)
	top := imagetest.Tar(t, imagetest.Entry{Name: "etc/.wh.gone"}, imagetest.Entry{Name: "etc/hostname", Body: "box\n"})
	ref := reg.Push(t, "test/rootfs:v1", imagetest.Image(t, []string{"/bin/hello"}, base, top))
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

func TestBase(t *testing.T) {
	requireTool(t, "mkfs.erofs", "erofs-utils")
	s, img := testStoreImage(t)
	cache := t.TempDir()
	// A base of the older recipe (no init layer) is replaced.
	legacy := filepath.Join(cache, "rootfs", strings.TrimPrefix(img.Digest, "sha256:")+".erofs")
	os.MkdirAll(filepath.Dir(legacy), 0o755)
	os.WriteFile(legacy, []byte("base of recipe 1"), 0o644)

	// Concurrent first calls build once.
	var wg sync.WaitGroup
	paths := make([]string, 3)
	errs := make([]error, 3)
	var builds int
	var mu sync.Mutex
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i], errs[i] = rootfs.BaseWith(context.Background(), s, img, cache, rootfs.BaseOptions{Note: func(m string) {
				if strings.HasPrefix(m, "built rootfs base") {
					mu.Lock()
					builds++
					mu.Unlock()
				}
			}})
		}()
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
	}
	want := rootfs.BasePath(cache, img.Digest)
	if paths[0] != want || paths[1] != want || paths[2] != want {
		t.Fatalf("Base = %v, want %s", paths, want)
	}
	if builds != 1 {
		t.Errorf("built %d times, want once", builds)
	}
	if _, err := os.Stat(legacy); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("base of the older recipe left behind: %v", err)
	}
	fi1, err := os.Stat(want)
	if err != nil {
		t.Fatal(err)
	}
	p, err := rootfs.Base(context.Background(), s, img, cache)
	if err != nil || p != want {
		t.Fatalf("second Base = %q, %v", p, err)
	}
	fi2, _ := os.Stat(want)
	if !os.SameFile(fi1, fi2) || !fi1.ModTime().Equal(fi2.ModTime()) {
		t.Errorf("second Base rebuilt the image")
	}
	ents, _ := os.ReadDir(filepath.Join(cache, "rootfs"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".build-") {
			t.Errorf("temporary build dir left: %s", e.Name())
		}
	}

	// Check the content with fsck.erofs --extract when available.
	if _, err := exec.LookPath("fsck.erofs"); err == nil {
		out := filepath.Join(t.TempDir(), "x")
		if b, err := exec.Command("fsck.erofs", "--extract="+out, want).CombinedOutput(); err != nil {
			t.Fatalf("fsck.erofs: %v: %s", err, b)
		}
		if b, err := os.ReadFile(filepath.Join(out, "etc/hostname")); err != nil || string(b) != "box\n" {
			t.Errorf("etc/hostname = %q, %v", b, err)
		}
		// The init layer: empty files the agent bind-mounts the box's over.
		for _, f := range []string{"etc/hosts", "etc/resolv.conf"} {
			if fi, err := os.Lstat(filepath.Join(out, f)); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
				t.Errorf("%s: %v %v, want an empty regular file", f, fi, err)
			}
		}
		if _, err := os.Lstat(filepath.Join(out, "etc/gone")); err == nil {
			t.Errorf("whiteout not applied in the erofs image")
		}
		if fi, err := os.Stat(filepath.Join(out, "bin/hello")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("bin/hello = %v", err)
		}
		if os.Geteuid() == 0 {
			fi, err := os.Stat(filepath.Join(out, "home/u"))
			if err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
				t.Errorf("home/u owner not kept: %v", err)
			}
		}
	}
}

func TestNewDisk(t *testing.T) {
	requireTool(t, "mkfs.ext4", "e2fsprogs")
	requireTool(t, "e2fsck", "e2fsprogs")
	for _, cache := range []string{"", t.TempDir()} {
		dir := t.TempDir()
		for i := 0; i < 2; i++ { // with a cache: the template is made, then reused
			p := filepath.Join(dir, fmt.Sprintf("rw%d.ext4", i))
			if err := rootfs.NewDisk(p, 256, cache); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(p)
			if err != nil || fi.Size() != 256<<20 {
				t.Fatalf("disk size %v, %v", fi, err)
			}
			if blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512; blocks > 16<<20 {
				t.Errorf("disk is not sparse: %d bytes allocated", blocks)
			}
			if out, err := exec.Command("e2fsck", "-fn", p).CombinedOutput(); err != nil {
				t.Errorf("cache %q disk %d: e2fsck: %v\n%s", cache, i, err, out)
			}
			if out, err := exec.Command("dumpe2fs", "-h", p).CombinedOutput(); err == nil && !strings.Contains(string(out), "airlock-rw") {
				t.Errorf("label missing: %s", out)
			}
			if err := rootfs.NewDisk(p, 256, cache); err == nil {
				t.Errorf("NewDisk overwrote an existing disk")
			}
		}
		if cache != "" {
			if _, err := os.Stat(filepath.Join(cache, "rootfs", "rw-256m-v1.ext4")); err != nil {
				t.Errorf("no template: %v", err)
			}
		}
	}
	if err := rootfs.NewDisk(filepath.Join(t.TempDir(), "small"), 4, ""); err == nil {
		t.Error("a 4 MiB disk was accepted")
	}
}

func TestInitLayer(t *testing.T) {
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("image\n"), 0o644)
	os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(root, "etc/resolv.conf"))
	if err := rootfs.InitLayer(root); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/hostname")); string(b) != "image\n" {
		t.Errorf("the image's own etc/hostname was replaced: %q", b)
	}
	for _, f := range []string{"etc/hosts", "etc/resolv.conf"} { // missing; dangling symlink
		if fi, err := os.Lstat(filepath.Join(root, f)); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
			t.Errorf("%s: %v %v, want an empty regular file", f, fi, err)
		}
	}
	// No /etc at all: made.
	root = t.TempDir()
	if err := rootfs.InitLayer(root); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "etc/hosts")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("etc/hosts in an image without /etc: %v", err)
	}
}

// mountTmpfs mounts a tmpfs of sizeKiB on a new directory (root only).
func mountTmpfs(t *testing.T, sizeKiB int) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%dk", sizeKiB)); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// A box's disk on another filesystem than the cache (AIRLOCK_HOME on a
// tmpfs): copy_file_range refuses with EXDEV, the copy falls back to reads
// and writes.
func TestNewDiskOnAnotherFilesystem(t *testing.T) {
	requireTool(t, "mkfs.ext4", "e2fsprogs")
	requireTool(t, "e2fsck", "e2fsprogs")
	cache := t.TempDir()
	other := mountTmpfs(t, 64<<10)
	for i := 0; i < 2; i++ { // the first makes the template, the second only copies
		p := filepath.Join(other, fmt.Sprintf("rw%d.ext4", i))
		if err := rootfs.NewDisk(p, 64, cache); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("e2fsck", "-fn", p).CombinedOutput(); err != nil {
			t.Fatalf("copied disk is not a clean ext4: %v\n%s", err, out)
		}
	}
}

// A full filesystem gives an error that says so, and no partial disk.
func TestNewDiskOnFullFilesystem(t *testing.T) {
	requireTool(t, "mkfs.ext4", "e2fsprogs")
	cache := t.TempDir()
	full := mountTmpfs(t, 64)
	p := filepath.Join(full, "rw.ext4")
	err := rootfs.NewDisk(p, 64, cache)
	if err == nil || !strings.Contains(err.Error(), "is full") || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("disk on a full filesystem: %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("partial disk left: %v", err)
	}
}
