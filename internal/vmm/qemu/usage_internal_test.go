package qemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/vmm"
)

// TestUsageHelperProcess is the stand-in QEMU of TestUsageCountsBoxQEMUs:
// this test binary, linked as qemu-system-x86_64, run with a box QEMU's
// -name and -m.
func TestUsageHelperProcess(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_USAGE_HELPER") != "1" {
		t.Skip("helper process of TestUsageCountsBoxQEMUs")
	}
	time.Sleep(time.Minute)
}

func TestUsageCountsBoxQEMUs(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Usage tells QEMUs by their executable's name.
	qemu := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	if err := os.Link(exe, qemu); err != nil {
		b, err := os.ReadFile(exe)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(qemu, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := &exec.Cmd{
		Path: qemu,
		Args: []string{"qemu-system-x86_64", "-test.run=^TestUsageHelperProcess$", "--", "-name", "airlock-usagetest", "-m", "64"},
		Env:  append(os.Environ(), "AIRLOCK_TEST_USAGE_HELPER=1"),
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	d := &Driver{}
	// Boxes of other tests may start or end meanwhile: compare scans that
	// agree with each other.
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, without, again := d.Usage(""), d.Usage("usagetest"), d.Usage("")
		if all == again {
			if got := (vmm.Usage{Machines: all.Machines - without.Machines, MemoryMiB: all.MemoryMiB - without.MemoryMiB}); got != (vmm.Usage{Machines: 1, MemoryMiB: 64}) {
				t.Fatalf("the stand-in box QEMU counts as %+v, want 1 machine of 64 MiB (all %+v, without it %+v)", got, all, without)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("Usage did not give two equal scans in 10 s")
		}
	}
}

// KillStray kills the QEMU a box's pid file names when it is that box's
// (-name airlock-ID), and nothing else: a pid file may name a process
// that reused the pid.
func TestKillStrayKillsOnlyTheBoxQEMU(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	start := func(name string) (*exec.Cmd, <-chan struct{}) {
		cmd := &exec.Cmd{
			Path: exe,
			Args: []string{"qemu-system-x86_64", "-test.run=^TestUsageHelperProcess$", "--", "-name", name, "-m", "64"},
			Env:  append(os.Environ(), "AIRLOCK_TEST_USAGE_HELPER=1"),
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
		return cmd, done
	}
	d := &Driver{}
	dir := t.TempDir()
	spec := vmm.Spec{ID: "straytest", Dir: dir}
	other, otherDone := start("airlock-someotherbox")
	os.WriteFile(filepath.Join(dir, boxdir.PID), []byte(strconv.Itoa(other.Process.Pid)+"\n"), 0o600)
	if err := d.KillStray(spec); err != nil {
		t.Fatal(err)
	}
	select {
	case <-otherDone:
		t.Fatal("KillStray killed a process that is not the box's QEMU")
	case <-time.After(100 * time.Millisecond):
	}
	stray, strayDone := start("airlock-straytest")
	os.WriteFile(filepath.Join(dir, boxdir.PID), []byte(strconv.Itoa(stray.Process.Pid)+"\n"), 0o600)
	if err := d.KillStray(spec); err != nil {
		t.Fatal(err)
	}
	select {
	case <-strayDone:
	case <-time.After(5 * time.Second):
		t.Fatal("KillStray left the box's QEMU running")
	}
	if err := d.KillStray(vmm.Spec{ID: "nopidfile", Dir: t.TempDir()}); err != nil {
		t.Fatalf("a box without a pid file: %v", err)
	}
}
