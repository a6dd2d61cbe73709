package qemu_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/confine"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

const helperEnv = "AIRLOCK_TEST_UNPRIV_DIR"

// TestLaunchUnprivileged starts a confined QEMU as a user that is not root
// (uid 65534, when the test runs as root): no uid change, but seccomp,
// no_new_privs and, where user namespaces are allowed, the jail and an
// empty network namespace.
func TestLaunchUnprivileged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts QEMU; skipped with -short")
	}
	if os.Getenv(helperEnv) != "" {
		t.Skip("helper mode")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no QEMU")
	}
	k, _, err := assets.FindKernel("")
	if err != nil {
		t.Skipf("no guest kernel: %v", err)
	}
	dir, err := os.MkdirTemp("", "airlock-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	if err := os.Mkdir(filepath.Join(dir, "share"), 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "share"), 0o777)
	kernel := filepath.Join(dir, "vmlinux")
	copyFile(t, k.Path, kernel)
	// The go tool's build directory is private: run a copy of the test
	// binary that the other user can execute.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "qemu.test")
	copyFile(t, self, bin)
	os.Chmod(bin, 0o755)
	cmd := exec.Command(bin, "-test.run=^TestLaunchUnprivilegedHelper$", "-test.v")
	if os.Geteuid() == 0 {
		// As a user logging in would: runuser (util-linux) where it is
		// installed, else a plain credential change.
		if ru, err := exec.LookPath("runuser"); err == nil {
			cmd = exec.Command(ru, "-u", "nobody", "--", bin, "-test.run=^TestLaunchUnprivilegedHelper$", "-test.v")
		} else {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
	}
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && strings.HasPrefix(k, "QEMU.") {
			got[strings.TrimPrefix(k, "QEMU.")] = v
		}
	}
	if got["Seccomp"] != "2" || got["NoNewPrivs"] != "1" {
		t.Errorf("unprivileged QEMU: Seccomp %q NoNewPrivs %q, want 2 and 1\n%s", got["Seccomp"], got["NoNewPrivs"], out)
	}
	t.Logf("helper: %v", got)
	if got["ramparts"] == "" || got["ramparts"] == "0" || got["imagemaps"] != got["ramparts"] {
		t.Errorf("unprivileged QEMU: RAM image of %q memfd parts, mapped %q times by the incoming QEMU; want the same, not 0\n%s", got["ramparts"], got["imagemaps"], out)
	}
	if got["CapEff"] != "0000000000000000" {
		t.Errorf("unprivileged QEMU has capabilities %q (in its user namespace)", got["CapEff"])
	}
	if u := strings.Fields(got["Uid"] + " x")[0]; os.Geteuid() == 0 && u != "65534" {
		t.Errorf("QEMU uid %q, want the caller's 65534", got["Uid"])
	}
	if confine.UserNSAllowed() == nil || os.Geteuid() == 0 {
		// Root can always make the namespaces; check the jail held.
		if got["netns"] != "own" || got["root"] != "jail" {
			t.Errorf("unprivileged QEMU: network namespace %q, root %q; want own and jail\n%s", got["netns"], got["root"], out)
		}
	}
}

// TestLaunchUnprivilegedHelper is TestLaunchUnprivileged's child, run as
// the unprivileged user: it launches QEMU and prints what /proc says.
func TestLaunchUnprivilegedHelper(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("only as TestLaunchUnprivileged's helper")
	}
	c := qemu.Config{
		Name: "airlock-unpriv-test", Accel: qemu.AccelTCG, MemoryMiB: 64,
		Kernel: filepath.Join(dir, "vmlinux"), Cmdline: "console=ttyS0 panic=-1 quiet",
		AgentSockets: []string{filepath.Join(dir, "a.sock")}, QMPSocket: filepath.Join(dir, "q.sock"),
		ConsoleLog: filepath.Join(dir, "console.log"), PIDFile: filepath.Join(dir, "qemu.pid"),
		Secret: []byte("s"), THP: qemu.THPNone,
		// A 9p share: bound into the jail (with the jail's /proc, which
		// QEMU's 9p server needs); QEMU fails to start without it.
		Shares: []qemu.Share{{ID: "vol0", Tag: "airlock.vol0", HostDir: filepath.Join(dir, "share")}},
	}
	pid, err := qemu.Launch(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	defer vmm.Kill(vmm.Handle{PID: pid, Start: vmm.StartTime(pid)})
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && (k == "Uid" || k == "Seccomp" || k == "NoNewPrivs" || k == "CapEff") {
			fmt.Printf("QEMU.%s=%s\n", k, strings.TrimSpace(v))
		}
	}
	self, _ := os.Readlink("/proc/self/ns/net")
	ns, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if ns != "" && ns != self {
		fmt.Println("QEMU.netns=own")
	}
	// The jail's root has the kernel at /boot/kernel and no /tmp.
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/root/boot/kernel"); err == nil {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/root/tmp"); os.IsNotExist(err) {
			fmt.Println("QEMU.root=jail")
		}
	}
	vmm.Kill(vmm.Handle{PID: pid, Start: vmm.StartTime(pid)})

	// A snapshot's RAM image: read from a confined QEMU's memfds, and
	// mapped by a confined incoming QEMU from a sealed memfd it opens
	// through the jail's /proc.
	c.Shares, c.THP, c.MemoryMiB = nil, qemu.THPCode, 128
	c.Cmdline = "console=ttyS0 panic=0 quiet" // a panic waits: QEMU stays up
	src, err := qemu.Launch(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := qemu.SaveRAMImageForTest(src, c, dir)
	if err != nil {
		vmm.Kill(vmm.Handle{PID: src, Start: vmm.StartTime(src)})
		t.Fatalf("RAM image of a confined QEMU: %v", err)
	}
	images, sealed, err := qemu.SealedRAMImagesForTest(src, c)
	vmm.Kill(vmm.Handle{PID: src, Start: vmm.StartTime(src)})
	if err != nil {
		t.Fatalf("sealed RAM image of a confined QEMU: %v", err)
	}
	defer func() {
		for _, f := range images {
			if f != nil {
				f.Close()
			}
		}
	}()
	if len(parts) != len(sealed) {
		t.Fatalf("RAM image of parts %v, sealed copies of %v", parts, sealed)
	}
	fmt.Printf("QEMU.ramparts=%d\n", len(sealed))
	c.Incoming, c.RAMImages = true, images
	dst, err := qemu.Launch(context.Background(), c)
	if err != nil {
		t.Fatalf("incoming QEMU mapping the RAM image: %v", err)
	}
	defer vmm.Kill(vmm.Handle{PID: dst, Start: vmm.StartTime(dst)})
	maps, _ := os.ReadFile("/proc/" + strconv.Itoa(dst) + "/maps")
	fmt.Printf("QEMU.imagemaps=%d\n", strings.Count(string(maps), "/memfd:airlock-ram-image"))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	out.Close()
}
