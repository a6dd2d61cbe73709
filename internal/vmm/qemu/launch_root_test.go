package qemu_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/confine"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// TestHostileGuestLaunchAsRoot starts a confined QEMU as root, as a box
// uid, with secrets in the caller's environment: QEMU holds no capability
// in any set (the bounding set included), runs with no_new_privs, and its
// environment (which code that took it over reads in /proc/self/environ)
// holds none of the caller's secrets.
func TestHostileGuestLaunchAsRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("starts QEMU; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (QEMU as a box uid)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no QEMU")
	}
	k, _, err := assets.FindKernel("")
	if err != nil {
		t.Skipf("no guest kernel: %v", err)
	}
	rng, err := confine.BoxUIDRange("")
	if err != nil {
		t.Skipf("no box uid range: %v", err)
	}
	uid, err := confine.AllocUID(rng)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("AIRLOCK_TOKEN", "host-token-x")
	t.Setenv("OPENAI_API_KEY", "sk-host-key-y")
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	copyFile(t, k.Path, kernel)
	c := qemu.Config{
		Name: "airlock-root-test", Accel: qemu.AccelTCG, MemoryMiB: 64,
		Kernel: kernel, Cmdline: "console=ttyS0 panic=0 quiet",
		AgentSockets: []string{filepath.Join(dir, "a.sock")}, QMPSocket: filepath.Join(dir, "q.sock"),
		ConsoleLog: filepath.Join(dir, "console.log"), PIDFile: filepath.Join(dir, "qemu.pid"),
		Secret: []byte("s"), THP: qemu.THPNone,
		Jail: qemu.Jail{UID: uid, GID: uid},
	}
	pid, err := qemu.Launch(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		vmm.Kill(vmm.Handle{PID: pid, Start: vmm.StartTime(pid)})
		// This process reaps QEMU and then records how it ended in the
		// box directory: wait for that record before TempDir's removal.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(qemu.ExitFile(c)); err == nil {
				return
			}
		}
	}()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	st := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if st[k] != "0000000000000000" {
			t.Errorf("QEMU %s %s, want 0000000000000000", k, st[k])
		}
	}
	if st["NoNewPrivs"] != "1" || st["Seccomp"] != "2" || strings.Fields(st["Uid"] + " x")[0] != strconv.Itoa(uid) {
		t.Errorf("QEMU NoNewPrivs %q Seccomp %q Uid %q, want 1, 2, %d", st["NoNewPrivs"], st["Seccomp"], st["Uid"], uid)
	}
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range strings.Split(string(env), "\x00") {
		if strings.Contains(e, "host-token-x") || strings.Contains(e, "sk-host-key-y") {
			t.Errorf("QEMU's environment holds the caller's secret %q", e)
		}
	}
}
