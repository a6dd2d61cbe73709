package airlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestVolumes: a read-only host directory even root cannot write, a live
// read-write one that no symlink leads out of, and a named volume that
// survives its box, has a size limit and cannot be removed while attached.
func TestVolumes(t *testing.T) {
	vmtest.Require(t)
	r := openRuntime(t, "")
	ctx := context.Background()
	roDir, rwDir, outside := t.TempDir(), t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(roDir, "ro.txt"), []byte("host ro\n"), 0o644)
	os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret\n"), 0o644)
	os.Symlink(outside, filepath.Join(rwDir, "out"))
	if _, err := r.CreateVolume(ctx, "testvol", 16); err != nil {
		t.Fatal(err)
	}
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled, Volumes: []airlock.Volume{
		{Source: roDir, Target: "/ro", ReadOnly: true},
		{Source: rwDir, Target: "/rw"},
		{Source: "testvol", Target: "/data"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })

	t.Run("read-only even after remount,rw as root", func(t *testing.T) {
		if got := sh(t, b, "cat /ro/ro.txt"); got != "host ro\n" {
			t.Fatalf("read: %q", got)
		}
		writesRefused(t, b, roDir, "echo x > /ro/new; mount -o remount,rw /ro; echo x > /ro/new2; echo y >> /ro/ro.txt; rm /ro/ro.txt; mkdir /ro/d; grep ' /ro ' /proc/mounts", 4, false)
	})

	t.Run("read-write is live both ways", func(t *testing.T) {
		liveBothWays(t, b, rwDir)
		// A copy into a path under a volume lands in the volume.
		src := filepath.Join(t.TempDir(), "copied.txt")
		os.WriteFile(src, []byte("copied"), 0o644)
		if err := b.CopyIn(ctx, src, "/rw/"); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(filepath.Join(rwDir, "copied.txt")); string(got) != "copied" {
			t.Fatalf("CopyIn under the volume: %q", got)
		}
	})

	t.Run("no way out through symlinks", func(t *testing.T) {
		// A host symlink in the share is resolved by the guest, in the guest.
		res := exec(t, b, airlock.ExecOptions{}, "cat", "/rw/out/secret")
		if res.ExitCode == 0 || strings.Contains(string(res.Stdout), "host secret") {
			t.Fatalf("read a host file outside the share: %q", res.Stdout)
		}
		// A symlink the box makes leads into the box, not the host.
		name := "airlock-escape-" + filepath.Base(rwDir)
		sh(t, b, "ln -s /tmp /rw/esc && echo boxed > /rw/esc/"+name)
		if _, err := os.Stat(filepath.Join("/tmp", name)); err == nil {
			os.Remove(filepath.Join("/tmp", name))
			t.Fatal("a write through a box symlink landed on the host's /tmp")
		}
		// mapped-xattr keeps a box's symlink as a plain file on the host:
		// no host program can be redirected by it either.
		if fi, err := os.Lstat(filepath.Join(rwDir, "esc")); err != nil || fi.Mode()&os.ModeSymlink != 0 {
			t.Errorf("box symlink on the host: %v %v", fi, err)
		}
		if got := sh(t, b, "cat /tmp/"+name); got != "boxed\n" {
			t.Errorf("in the box: %q", got)
		}
	})

	t.Run("no setuid file on the host", func(t *testing.T) {
		// The volume is root's when the tests run as root: a setuid bit
		// there would be a setuid-root program on the host. mapped-xattr
		// keeps the box's modes in xattrs (the box sees 6755), and QEMU's
		// stage filter would refuse a real one (TestHostileGuestNoSetIDFilesInJail).
		if err := os.WriteFile(filepath.Join(rwDir, "hostprog"), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		got := sh(t, b, "cp /bin/sh /rw/suid && chmod 4755 /rw/suid && chmod g+s /rw/suid && chmod u+s,g+s /rw/hostprog && "+
			"mkdir -m 2755 /rw/sgid && stat -c '%n %a' /rw/suid /rw/hostprog /rw/sgid")
		if want := "/rw/suid 6755\n/rw/hostprog 6755\n/rw/sgid 2755\n"; got != want {
			t.Errorf("in the box: %q, want %q (the box's own modes)", got, want)
		}
		for _, name := range []string{"suid", "hostprog", "sgid"} {
			fi, err := os.Stat(filepath.Join(rwDir, name))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
				t.Errorf("on the host, %s is %v (owner %d): a setuid or setgid file", name, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
			}
		}
	})

	t.Run("named volume: size limit, kept after the box, not removable while attached", func(t *testing.T) {
		sh(t, b, "echo kept > /data/kept.txt")
		res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", "dd if=/dev/zero of=/data/fill bs=1M count=64 2>&1; rm -f /data/fill")
		if !strings.Contains(string(res.Stdout), "No space left") {
			t.Errorf("filling a 16 MiB volume: %s", res.Stdout)
		}
		if err := r.RemoveVolume(ctx, "testvol"); !errors.Is(err, airlock.ErrVolumeInUse) {
			t.Fatalf("RemoveVolume while attached: %v", err)
		}
		if err := b.Remove(ctx, true); err != nil {
			t.Fatal(err)
		}
		b2, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled, Volumes: []airlock.Volume{{Source: "testvol", Target: "/again", ReadOnly: true}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := sh(t, b2, "cat /again/kept.txt"); got != "kept\n" {
			t.Errorf("after the box was removed: %q", got)
		}
		if err := b2.Remove(ctx, true); err != nil {
			t.Fatal(err)
		}
		if err := r.RemoveVolume(ctx, "testvol"); err != nil {
			t.Fatal(err)
		}
		if vols, _ := r.Volumes(ctx); len(vols) != 0 {
			t.Errorf("volumes left: %+v", vols)
		}
	})

}

// writesRefused runs script (writes to the read-only volume /ro, a remount
// rw as root, and a grep of /proc/mounts) in b and checks that at least
// want writes failed with EROFS and that the host directory roDir still
// holds only ro.txt with its text. With mustRemount the guest's remount
// must have taken (the host, not the guest's mount flags, refuses).
func writesRefused(t *testing.T, b *airlock.Box, roDir, script string, want int, mustRemount bool) {
	t.Helper()
	res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", script)
	if !strings.Contains(string(res.Stdout), "rw,") {
		if mustRemount {
			t.Errorf("the guest remount did not take (the test needs it to): %s %s", res.Stdout, res.Stderr)
		} else {
			t.Logf("remount: %s %s", res.Stdout, res.Stderr)
		}
	}
	if n := strings.Count(string(res.Stderr), "Read-only file system"); n < want {
		t.Errorf("want every write refused (EROFS) by the host, got: %s", res.Stderr)
	}
	ents, _ := os.ReadDir(roDir)
	got, _ := os.ReadFile(filepath.Join(roDir, "ro.txt"))
	if len(ents) != 1 || string(got) != "host ro\n" {
		t.Errorf("host directory changed: %v %q", ents, got)
	}
}

// liveBothWays checks that the read-write volume rwDir, mounted at /rw in
// box b, shows a file the host writes after the start, and the host a
// file the box writes.
func liveBothWays(t *testing.T, b *airlock.Box, rwDir string) {
	t.Helper()
	os.WriteFile(filepath.Join(rwDir, "late.txt"), []byte("written after start\n"), 0o644)
	if got := sh(t, b, "cat /rw/late.txt; echo from box > /rw/box.txt"); got != "written after start\n" {
		t.Fatalf("host write seen in the box: %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(rwDir, "box.txt")); string(got) != "from box\n" {
		t.Fatalf("box write seen on the host: %q", got)
	}
}

// TestVolumeOwnership: what a box writes to a host directory lands with
// the directory owner's uid and gid and the modes of the host's umask
// (0644 and 0755 under 022), not QEMU's 0600 and 0700, while the box
// keeps its own view (its owner, its modes, a setuid bit) in the extended
// attributes: no setuid file reaches the host; and the host's files show
// their host owner in the box, as root starts it (not the box's
// confinement uid), or root for the caller's own files when airlock runs
// unprivileged (#39 point 7).
func TestVolumeOwnership(t *testing.T) {
	vmtest.Require(t)
	r := openRuntime(t, "")
	ctx := context.Background()
	dir := t.TempDir()
	wantUID, wantGID := os.Getuid(), os.Getgid()
	if os.Getuid() == 0 {
		// A directory of another user's, as a user's directory shared by
		// a root airlock.
		wantUID, wantGID = 1234, 2345
		if err := os.Chown(dir, wantUID, wantGID); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "host.txt"), []byte("from the host\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "host.txt"), wantUID, wantGID); err != nil {
		t.Fatal(err)
	}
	// In the box: the host owner, except for an unprivileged airlock's
	// confined QEMU, whose user namespace maps the caller to root.
	inBox := strconv.Itoa(wantUID) + ":" + strconv.Itoa(wantGID)
	if os.Getuid() != 0 && os.Getenv("AIRLOCK_CONFINE") != "off" {
		inBox = "0:0"
	}
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled, Volumes: []airlock.Volume{{Source: dir, Target: "/v"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	if got, want := sh(t, b, "stat -c '%n %u:%g' /v /v/host.txt; cat /v/host.txt"), "/v "+inBox+"\n/v/host.txt "+inBox+"\nfrom the host\n"; got != want {
		t.Errorf("host files in the box: %q, want %q (their host owner)", got, want)
	}
	got := sh(t, b, "echo x > /v/f; mkdir /v/d; echo y > /v/s; chmod 4755 /v/s; stat -c '%n %u:%g %a' /v/f /v/d /v/s")
	if want := "/v/f 0:0 644\n/v/d 0:0 755\n/v/s 0:0 4755\n"; got != want {
		t.Errorf("in the box: %q, want %q (the box's own owner and modes)", got, want)
	}
	fileMode, dirMode := os.FileMode(0o644), os.FileMode(0o755)
	if u := hostUmask(t); u != 0o022 {
		fileMode, dirMode = 0o666&^u, 0o777&^u
	}
	for name, mode := range map[string]os.FileMode{"f": fileMode, "d": dirMode | os.ModeDir, "s": fileMode} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != wantUID || int(st.Gid) != wantGID || fi.Mode() != mode {
			t.Errorf("on the host, %s: %d:%d %v, want %d:%d %v", name, st.Uid, st.Gid, fi.Mode(), wantUID, wantGID, mode)
		}
	}
}

// hostUmask is this process's umask, read without changing it.
func hostUmask(t *testing.T) os.FileMode {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil {
				t.Fatal(err)
			}
			return os.FileMode(m)
		}
	}
	t.Fatal("no Umask in /proc/self/status")
	return 0
}
