package airlock_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

func sh(t *testing.T, b *airlock.Box, script string) string {
	t.Helper()
	res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", script)
	if res.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit %d: %s%s", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))
}

// TestFiles moves data in and out of one box: round trips with SHA-256,
// trees, `docker cp` rules, hostile trees, the files API and its errors.
func TestFiles(t *testing.T) {
	vmtest.Require(t)
	r := openRuntime(t, "")
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled, MemoryMiB: 384})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })

	t.Run("round trip", func(t *testing.T) {
		sizes := []int64{0, 18<<10 + 1, 64 << 20, 256 << 20}
		if testing.Short() {
			sizes = sizes[:2]
		}
		for _, n := range sizes {
			dir := t.TempDir()
			src := filepath.Join(dir, "blob")
			f, _ := os.Create(src)
			io.CopyN(f, rand.Reader, n)
			f.Close()
			want := fileSHA(t, src)
			t0 := time.Now()
			if err := b.CopyIn(ctx, src, "/tmp/"); err != nil {
				t.Fatalf("%d B: copy in: %v", n, err)
			}
			in := time.Since(t0)
			got := strings.Fields(sh(t, b, "sha256sum /tmp/blob"))[0]
			if got != want {
				t.Fatalf("%d B: sha256 in the box %s, host %s", n, got, want)
			}
			t0 = time.Now()
			back := filepath.Join(dir, "back")
			if err := b.CopyOut(ctx, "/tmp/blob", back); err != nil {
				t.Fatalf("%d B: copy out: %v", n, err)
			}
			if got := fileSHA(t, back); got != want {
				t.Fatalf("%d B: sha256 back %s, want %s", n, got, want)
			}
			t.Logf("%d B: in %v, out %v", n, in.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
			sh(t, b, "rm /tmp/blob")
		}
	})

	t.Run("tree", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "tree")
		os.MkdirAll(filepath.Join(src, "empty"), 0o700)
		os.MkdirAll(filepath.Join(src, "sub"), 0o751)
		os.WriteFile(filepath.Join(src, "sub", "a"), []byte("A"), 0o640)
		os.Link(filepath.Join(src, "sub", "a"), filepath.Join(src, "hard"))
		os.Symlink("sub/a", filepath.Join(src, "rel"))
		os.Symlink("/etc/passwd", filepath.Join(src, "abs"))
		os.WriteFile(filepath.Join(src, "n\xe9\xff"), []byte("bytes"), 0o600)
		mt := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
		os.Chtimes(filepath.Join(src, "sub", "a"), mt, mt)
		if err := b.CopyIn(ctx, src, "/t"); err != nil {
			t.Fatal(err)
		}
		out := sh(t, b, `cd /t && stat -c '%n %a %h %Y' sub/a hard && readlink rel abs && stat -c '%a' empty sub && cat "$(printf 'n\351\377')" && ls -ld empty | cut -c1`)
		want := "sub/a 640 2 1577934245\nhard 640 2 1577934245\nsub/a\n/etc/passwd\n700\n751\nbytesd\n"
		if out != want {
			t.Fatalf("in the box:\n%s\nwant:\n%s", out, want)
		}
		back := filepath.Join(dir, "back")
		if err := b.CopyOut(ctx, "/t", back); err != nil {
			t.Fatal(err)
		}
		if l, _ := os.Readlink(filepath.Join(back, "abs")); l != "/etc/passwd" {
			t.Errorf("abs -> %q", l)
		}
		var s1, s2 syscall.Stat_t
		syscall.Stat(filepath.Join(back, "sub", "a"), &s1)
		syscall.Stat(filepath.Join(back, "hard"), &s2)
		if s1.Ino != s2.Ino {
			t.Error("hard link not kept on the way out")
		}
		if b, _ := os.ReadFile(filepath.Join(back, "n\xe9\xff")); string(b) != "bytes" {
			t.Errorf("non-UTF-8 name: %q", b)
		}
		if fi, err := os.Stat(filepath.Join(back, "empty")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("empty dir: %v %v", fi, err)
		}
		// Into an existing directory: inside it; "/." copies the contents.
		os.Mkdir(filepath.Join(dir, "exist"), 0o755)
		if err := b.CopyOut(ctx, "/t", filepath.Join(dir, "exist")); err != nil {
			t.Fatal(err)
		}
		if err := b.CopyOut(ctx, "/t/.", filepath.Join(dir, "exist")); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"exist/t/sub/a", "exist/sub/a"} {
			if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
				t.Error(err)
			}
		}
		// A file to a missing path ending in "/" is an error.
		if err := b.CopyOut(ctx, "/t/sub/a", filepath.Join(dir, "nodir")+"/"); err == nil {
			t.Error("copy of a file to a missing dir/ succeeded")
		}
	})

	t.Run("tar streams", func(t *testing.T) {
		rc, err := b.CopyOutTar(ctx, "/etc/hostname")
		if err != nil {
			t.Fatal(err)
		}
		tarb, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		cmd := osexec.Command("tar", "-t")
		cmd.Stdin = bytes.NewReader(tarb)
		if out, err := cmd.Output(); err != nil || string(out) != "hostname\n" {
			t.Fatalf("tar -t: %q %v", out, err)
		}
		sh(t, b, "mkdir -p /fromtar")
		if err := b.CopyInTar(ctx, "/fromtar", bytes.NewReader(tarb)); err != nil {
			t.Fatal(err)
		}
		sh(t, b, "cmp /etc/hostname /fromtar/hostname")
		if _, err := b.CopyOutTar(ctx, "/no/such"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("missing source: %v", err)
		}
	})

	t.Run("hostile trees from the box stay in the destination", func(t *testing.T) {
		sh(t, b, `mkdir -p /h/d && cd /h && ln -s /etc x && ln -s ../../.. up && ln -s / d/root && echo hi > d/f && mkfifo fifo && cp /bin/true suid && chmod 4755 suid`)
		parent := t.TempDir()
		os.WriteFile(filepath.Join(parent, "keep"), []byte("keep"), 0o644)
		dest := filepath.Join(parent, "dest")
		err := b.CopyOut(ctx, "/h", dest)
		if err == nil || !strings.Contains(err.Error(), "fifo") {
			t.Fatalf("a FIFO in the tree: want an error naming it, got %v", err)
		}
		if _, err := os.Lstat(dest); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a failed copy left %s behind: %v", dest, err)
		}
		sh(t, b, "rm /h/fifo")
		if err := b.CopyOut(ctx, "/h", dest); err != nil {
			t.Fatal(err)
		}
		ents, _ := os.ReadDir(parent)
		if len(ents) != 2 {
			t.Errorf("destination's parent changed: %v", ents)
		}
		for name, want := range map[string]string{"x": "/etc", "up": "../../..", "d/root": "/"} {
			if l, err := os.Readlink(filepath.Join(dest, name)); err != nil || l != want {
				t.Errorf("%s: %q %v", name, l, err)
			}
		}
		if fi, _ := os.Stat(filepath.Join(dest, "suid")); fi == nil || fi.Mode()&fs.ModeSetuid != 0 {
			t.Errorf("setuid bit kept on the host: %v", fi)
		}
		// Copying again over the same tree writes through no symlink.
		if err := b.CopyOut(ctx, "/h/.", filepath.Join(dest, "up")); err == nil {
			t.Error("copy into a destination that is a symlink climbing out succeeded")
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 2 {
			t.Errorf("destination's parent changed: %v", ents)
		}
	})

	t.Run("copy in stays in the box root", func(t *testing.T) {
		// The agent runs outside the box root; a symlink in the box
		// pointing "above" its root still resolves inside it.
		sh(t, b, "ln -sfn ../../../../.. /esc")
		if err := b.WriteFile(ctx, "/esc/landed", []byte("in root"), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, b, "cat /landed && stat -c %a /landed"); got != "in root600\n" {
			t.Errorf("got %q", got)
		}
	})

	t.Run("files API", func(t *testing.T) {
		if err := b.MkdirAll(ctx, "/api/a/b", 0o750); err != nil {
			t.Fatal(err)
		}
		if err := b.WriteFile(ctx, "/api/a/b/f.txt", []byte("one"), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := b.WriteFile(ctx, "/api/a/b/f.txt", []byte("two!"), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := b.ReadFile(ctx, "/api/a/b/f.txt")
		if err != nil || string(got) != "two!" {
			t.Fatalf("ReadFile: %q %v", got, err)
		}
		fi, err := b.Stat(ctx, "/api/a/b/f.txt")
		if err != nil || fi.Size != 4 || fi.Mode != 0o600 || fi.Name != "f.txt" {
			t.Fatalf("Stat: %+v %v", fi, err)
		}
		ents, err := b.ReadDir(ctx, "/api/a/b")
		if err != nil || len(ents) != 1 || ents[0].Name != "f.txt" {
			t.Fatalf("ReadDir: %+v %v", ents, err)
		}
		big := bytes.Repeat([]byte("x"), 18<<10+1) // OpenSandbox #1016: >18 KB lost
		if err := b.WriteFile(ctx, "/api/big", big, 0); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, b, "wc -c < /api/big"); got != "18433\n" {
			t.Errorf("big write: %q", got)
		}
		if _, err := b.ReadFile(ctx, "/api/missing"); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "/api/missing") {
			t.Errorf("ReadFile missing: %v", err)
		}
		if _, err := b.Stat(ctx, "/api/missing"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Stat missing: %v", err)
		}
		if err := b.WriteFile(ctx, "/api/nodir/f", nil, 0); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("WriteFile into a missing dir: %v", err)
		}
		if err := b.RemovePath(ctx, "/api"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Stat(ctx, "/api"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after RemovePath: %v", err)
		}
	})

	t.Run("no space leaves no half-written file", func(t *testing.T) {
		sh(t, b, "mkdir -p /small && mount -t tmpfs -o size=1m tmpfs /small && echo old > /small/f")
		err := b.WriteFile(ctx, "/small/f", make([]byte, 3<<20), 0o644)
		if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "/small/f") {
			t.Fatalf("WriteFile to a full disk: %v", err)
		}
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "f"), make([]byte, 3<<20), 0o644)
		if err := b.CopyIn(ctx, filepath.Join(dir, "f"), "/small/f"); !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("CopyIn to a full disk: %v", err)
		}
		if got := sh(t, b, "ls -A /small; cat /small/f"); got != "f\nold\n" {
			t.Errorf("after failed writes: %q", got)
		}
	})

	t.Run("an early error ends an upload whose source blocks", func(t *testing.T) {
		sh(t, b, "mkdir -p /rodst /fulldst && mount -t tmpfs -o ro tmpfs /rodst && mount -t tmpfs -o size=1m tmpfs /fulldst")
		for _, c := range []struct {
			name, dir string
			sent      int // bytes of the file sent before the source blocks
			want      syscall.Errno
		}{
			{"read-only destination", "/rodst", 4 << 10, syscall.EROFS},
			{"full destination", "/fulldst", 1<<20 + 128<<10, syscall.ENOSPC},
		} {
			t.Run(c.name, func(t *testing.T) {
				// A tar of one 3 MiB file, of which the source sends the
				// header and c.sent bytes, then blocks: the pipe is never
				// closed while CopyInTar runs.
				pr, pw := io.Pipe()
				t.Cleanup(func() { pw.Close() })
				go func() {
					tw := tar.NewWriter(pw)
					tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: 3 << 20, Typeflag: tar.TypeReg})
					tw.Write(make([]byte, c.sent))
				}()
				done := make(chan error, 1)
				go func() { done <- b.CopyInTar(ctx, c.dir, pr) }()
				select {
				case err := <-done:
					if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.dir) {
						t.Fatalf("CopyInTar: %v, want %v naming %s", err, c.want, c.dir)
					}
				case <-time.After(20 * time.Second):
					t.Fatalf("CopyInTar still waits for its source 20 s after the box failed the copy")
				}
				// The uploader may still sit in a Read of the source: one
				// more write ends that Read, and the uploader must then
				// stop, not read on.
				go pw.Write(make([]byte, 512))
				deadline := time.Now().Add(10 * time.Second)
				for uploaders() > 0 {
					if time.Now().After(deadline) {
						t.Fatalf("an uploader goroutine still runs (reads the source on) after CopyInTar returned")
					}
					time.Sleep(20 * time.Millisecond)
				}
				if got := sh(t, b, "ls -A "+c.dir+" | wc -l"); strings.TrimSpace(got) != "0" {
					t.Errorf("%s holds leftovers after the failed copy: %s", c.dir, sh(t, b, "ls -A "+c.dir))
				}
			})
		}
	})
}

// uploaders counts the goroutines that upload a file call's data
// (boxfiles.Box.send's reader of the source).
func uploaders() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "boxfiles.(*Box).send.func")
}
