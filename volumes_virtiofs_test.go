package airlock_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// virtiofsds returns the pids of the virtiofsd processes sharing dir.
func virtiofsds(dir string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(b), "virtiofsd") && strings.Contains(string(b), "source="+dir+"\x00") {
			out = append(out, pid)
		}
	}
	return out
}

// TestVolumesVirtioFS: host directories over virtio-fs (VolumeTransport
// "virtiofs"): a read-only one even root cannot write, a read-write one
// that is live both ways, that no symlink leads out of and where root in
// the box can make no setuid file or device node, and daemons that end
// with the box.
func TestVolumesVirtioFS(t *testing.T) {
	vmtest.Require(t)
	if os.Geteuid() != 0 {
		t.Skip("virtio-fs volumes need root (the C virtiofsd sandboxes itself with namespaces)")
	}
	r, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}, VolumeTransport: "virtiofs"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ctx := context.Background()
	roDir, rwDir, outside := t.TempDir(), t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(roDir, "ro.txt"), []byte("host ro\n"), 0o644)
	os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret\n"), 0o644)
	os.Symlink(outside, filepath.Join(rwDir, "out"))
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled, Volumes: []airlock.Volume{
		{Source: roDir, Target: "/ro", ReadOnly: true},
		{Source: rwDir, Target: "/rw"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	if got := sh(t, b, "grep -c ' virtiofs ' /proc/mounts"); got != "2\n" {
		t.Fatalf("virtio-fs mounts in the box: %q", got)
	}

	t.Run("confined QEMU, daemons in their own cgroup", func(t *testing.T) {
		// QEMU runs as the box's uid in its jail and reaches the root-owned
		// sockets through descriptors; the daemons stay root, outside it,
		// each whole (with its sandbox's child) in the fs- cgroup.
		if v := strings.ToLower(os.Getenv("AIRLOCK_CONFINE")); v == "off" || v == "0" || v == "false" {
			t.Skip("AIRLOCK_CONFINE=" + v)
		}
		info, err := b.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st := procStatus(t, info.PID)
		if u := strings.Fields(st["Uid"] + " 0")[0]; u == "0" || st["Seccomp"] != "2" {
			t.Errorf("QEMU Uid %q Seccomp %q: want a box uid and a seccomp filter", st["Uid"], st["Seccomp"])
		}
		if ents, err := os.ReadDir("/proc/" + strconv.Itoa(info.PID) + "/root"); err != nil || len(ents) == 0 {
			t.Errorf("QEMU's root: %v %v", ents, err)
		} else {
			for _, e := range ents {
				if e.Name() == "tmp" || e.Name() == "run" {
					t.Errorf("QEMU's jail shows /%s", e.Name())
				}
			}
		}
		cg, err := os.ReadFile(filepath.Join(boxDir(r, b), "virtiofsd.cgroup"))
		if err != nil {
			t.Skipf("no cgroup for the daemons on this host: %v", err)
		}
		var procs []string
		for _, d := range strings.Fields(string(cg)) {
			p, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			procs = append(procs, strings.Fields(string(p))...)
		}
		pids := append(virtiofsds(roDir), virtiofsds(rwDir)...)
		if len(pids) < 4 {
			t.Errorf("want a daemon and its sandbox's child per share, got %v", pids)
		}
		for _, pid := range pids {
			if !strings.Contains(" "+strings.Join(procs, " ")+" ", " "+strconv.Itoa(pid)+" ") {
				t.Errorf("virtiofsd %d not in its cgroup %s (%v)", pid, cg, procs)
			}
		}
	})

	t.Run("read-only even after remount,rw as root", func(t *testing.T) {
		if got := sh(t, b, "cat /ro/ro.txt"); got != "host ro\n" {
			t.Fatalf("read: %q", got)
		}
		writesRefused(t, b, roDir, "mount -o remount,rw /ro && grep ' /ro ' /proc/mounts; echo x > /ro/new; echo y >> /ro/ro.txt; rm /ro/ro.txt; mkdir /ro/d; touch /ro/ro.txt", 5, true)
	})

	t.Run("read-write is live both ways", func(t *testing.T) {
		liveBothWays(t, b, rwDir)
		os.WriteFile(filepath.Join(rwDir, "late.txt"), []byte("changed\n"), 0o644)
		if got := sh(t, b, "cat /rw/late.txt"); got != "changed\n" {
			t.Fatalf("host change seen in the box: %q", got)
		}
	})

	t.Run("no way out through symlinks or .., no setuid files or device nodes", func(t *testing.T) {
		// A host symlink in the share is resolved by the guest, in the guest.
		res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", "cat /rw/out/secret; cat /rw/../../"+outside+"/secret")
		if strings.Contains(string(res.Stdout), "host secret") {
			t.Fatalf("read a host file outside the share: %q", res.Stdout)
		}
		// A symlink the box makes (a real one on the host, over virtio-fs)
		// leads into the box when the box follows it.
		name := "airlock-escape-" + filepath.Base(rwDir)
		sh(t, b, "ln -s /tmp /rw/esc && echo boxed > /rw/esc/"+name+" && ln -s ../../../../../.. /rw/up && ls /rw/up/ > /dev/null")
		if _, err := os.Stat(filepath.Join("/tmp", name)); err == nil {
			os.Remove(filepath.Join("/tmp", name))
			t.Fatal("a write through a box symlink landed on the host's /tmp")
		}
		if got := sh(t, b, "cat /tmp/"+name); got != "boxed\n" {
			t.Errorf("in the box: %q", got)
		}
		// No setuid or setgid file on the host (virtiofsd runs under the
		// stage's filter): root in the box gets EPERM for the bits, and
		// the rest of a chmod or create still works.
		res = exec(t, b, airlock.ExecOptions{}, "sh", "-c", "cp /bin/sh /rw/suid; chmod 755 /rw/suid && echo PLAIN; "+
			"chmod 4755 /rw/suid || echo REFUSED-SUID; chmod g+s /rw/suid || echo REFUSED-SGID; mkdir -m 2755 /rw/sgid || echo REFUSED-DIR")
		for _, want := range []string{"PLAIN", "REFUSED-SUID", "REFUSED-SGID", "REFUSED-DIR"} {
			if !strings.Contains(string(res.Stdout), want+"\n") {
				t.Errorf("want %s: %s %s", want, res.Stdout, res.Stderr)
			}
		}
		for _, name := range []string{"suid", "sgid"} {
			if fi, err := os.Stat(filepath.Join(rwDir, name)); err == nil && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
				t.Errorf("on the host, %s is %v: a setuid or setgid file", name, fi.Mode())
			}
		}
		// No device nodes on the host (virtiofsd runs without CAP_MKNOD).
		if res := exec(t, b, airlock.ExecOptions{}, "mknod", "/rw/mem", "c", "1", "1"); res.ExitCode == 0 {
			t.Error("mknod of /dev/mem's device in the share succeeded")
		}
		if _, err := os.Lstat(filepath.Join(rwDir, "mem")); err == nil {
			t.Error("a device node appeared in the host directory")
		}
	})

	gone := func(t *testing.T, after string) {
		t.Helper()
		// Each daemon ends when QEMU closes its socket.
		deadline := time.Now().Add(5 * time.Second)
		for left := append(virtiofsds(roDir), virtiofsds(rwDir)...); len(left) > 0; left = append(virtiofsds(roDir), virtiofsds(rwDir)...) {
			if time.Now().After(deadline) {
				t.Fatalf("virtiofsd still running 5 s after %s: %v", after, left)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Run("daemons end with the box", func(t *testing.T) {
		// One daemon per share (with the child its sandbox forks).
		if len(virtiofsds(roDir)) == 0 || len(virtiofsds(rwDir)) == 0 {
			t.Fatalf("virtiofsd processes: %v for the ro share, %v for the rw one", virtiofsds(roDir), virtiofsds(rwDir))
		}
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		gone(t, "Stop")
		// A restart gets fresh daemons; a forced removal (QEMU killed)
		// ends them too.
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, b, "cat /rw/box.txt /ro/ro.txt"); got != "from box\nhost ro\n" {
			t.Fatalf("after restart: %q", got)
		}
		// QEMU killed outright: its descriptors close, the daemons end.
		info, err := b.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cg := filepath.Join(boxDir(r, b), "virtiofsd.cgroup")
		dirs, _ := os.ReadFile(cg)
		syscall.Kill(info.PID, syscall.SIGKILL)
		gone(t, "kill -9 of QEMU")
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, b, "cat /ro/ro.txt"); got != "host ro\n" {
			t.Fatalf("after kill and start: %q", got)
		}
		if err := b.Remove(ctx, true); err != nil {
			t.Fatal(err)
		}
		gone(t, "Remove")
		// The daemons' cgroup is gone with the box.
		for _, d := range strings.Fields(string(dirs)) {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("cgroup %s left after the box", d)
			}
		}
	})
}
