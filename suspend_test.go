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
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestSuspendQEMU: a box paused to disk has no QEMU left and says it is
// suspended; Resume continues it as the same box, with its files, a
// running process's memory and pid, its hostname and the host's time;
// Stop discards the saved state and Start then boots; the CLI's pause
// --to-disk, ls -a and unpause do the same.
func TestSuspendQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	home := t.TempDir()
	r := openRuntime(t, home)
	b, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage, Name: "sus"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	shIn(t, b, "echo kept > /root/f")
	drawn := shIn(t, b, holder)
	pid := shIn(t, b, "cat /root/holder.pid")
	before, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(home, "boxes", b.ID(), "suspended")

	t0 := time.Now()
	if err := b.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("suspend took %s", time.Since(t0).Round(time.Millisecond))
	info, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != "stopped" || !info.Suspended || info.PID != 0 {
		t.Fatalf("after Suspend: state %q, suspended %v, pid %d", info.State, info.Suspended, info.PID)
	}
	// A call into it says it is paused to disk and what to do (it said
	// only "box is not running").
	if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); !errors.Is(err, airlock.ErrBoxNotRunning) || !strings.Contains(err.Error(), "paused to disk") || !strings.Contains(err.Error(), "unpause") {
		t.Errorf("exec in a box paused to disk: %v", err)
	}
	if raw, err := os.ReadFile("/proc/" + strconv.Itoa(before.PID) + "/cmdline"); err == nil && strings.Contains(string(raw), b.ID()) {
		t.Fatalf("the box's QEMU (pid %d) still runs after Suspend", before.PID)
	}
	if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); !errors.Is(err, airlock.ErrBoxNotRunning) {
		t.Fatalf("exec in a suspended box: %v", err)
	}
	// The saved state links the box's writable layer; no copy of it.
	var own, kept syscall.Stat_t
	if err := syscall.Stat(filepath.Join(home, "boxes", b.ID(), "rw.ext4"), &own); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(saved, "rw.ext4"), &kept); err != nil {
		t.Fatal(err)
	}
	if own.Ino != kept.Ino {
		t.Errorf("the saved state holds a copy of the writable layer (inode %d, the box's %d), not a link", kept.Ino, own.Ino)
	}
	// Let the saved clock fall behind the host's.
	time.Sleep(1500 * time.Millisecond)
	t0 = time.Now()
	if err := b.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("resume from disk took %s", time.Since(t0).Round(time.Millisecond))
	got := strings.Split(shIn(t, b, "cat /root/f /root/holder.pid; hostname; date +%s.%N"), "\n")
	host := float64(time.Now().UnixNano()) / 1e9
	if len(got) != 4 || got[0] != "kept" || got[1] != pid || got[2] != "sus" {
		t.Fatalf("after Resume: file, holder pid, hostname, date: %q (want kept, %s, sus)", got, pid)
	}
	if guest, _ := strconv.ParseFloat(got[3], 64); host-guest > 1 || host-guest < -1 {
		t.Errorf("guest clock %.3f, host %.3f after Resume", guest, host)
	}
	if v := askHolder(t, b); v != drawn {
		t.Errorf("the process running at suspend answered %q, want %q", v, drawn)
	}
	if info, _ := b.Info(ctx); info.State != "running" || info.Suspended {
		t.Errorf("after Resume: state %q, suspended %v", info.State, info.Suspended)
	}
	if _, err := os.Stat(saved); !os.IsNotExist(err) {
		t.Errorf("the saved state is still there after Resume: %v", err)
	}

	t.Run("stop of a suspended box shuts it down from where it was", func(t *testing.T) {
		// Written just before: in the guest's page cache only, unless
		// something flushes it.
		shIn(t, b, "echo late > /root/late")
		if err := b.Suspend(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if info, _ := b.Info(ctx); info.Suspended || info.State != "stopped" {
			t.Fatalf("after Stop: state %q, suspended %v", info.State, info.Suspended)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := shIn(t, b, `cat /root/f /root/late; [ "$(cat /proc/$(cat /root/holder.pid)/comm 2>/dev/null)" = python3 ] || echo booted`); got != "kept\nlate\nbooted" {
			t.Errorf("after Stop and Start: %q, want both files and a fresh boot", got)
		}
	})
	t.Run("cli", func(t *testing.T) {
		images := vmtest.ImagesDir() // before AIRLOCK_HOME changes it
		t.Setenv("AIRLOCK_HOME", home)
		t.Setenv("AIRLOCK_IMAGES", images)
		if out, errs, err := runCLI("pause", "--to-disk", "sus"); err != nil {
			t.Fatalf("pause --to-disk: %q %q %v", out, errs, err)
		}
		// Listed without -a: it is not gone, unpause continues it.
		out, errs, err := runCLI("ls", "--format", "{{.Name}}: {{.Status}}")
		if err != nil || !strings.Contains(out, "sus: Paused to disk") {
			t.Fatalf("ls: %q %q %v", out, errs, err)
		}
		if out, errs, err := runCLI("inspect", "-f", "{{.State.Status}} {{.State.PausedToDisk}}", "sus"); err != nil || out != "stopped true\n" {
			t.Fatalf("inspect: %q %q %v", out, errs, err)
		}
		if out, errs, err := runCLI("unpause", "sus"); err != nil {
			t.Fatalf("unpause: %q %q %v", out, errs, err)
		}
		b2, err := r.Get(ctx, "sus")
		if err != nil {
			t.Fatal(err)
		}
		if got := shIn(t, b2, "cat /root/f"); got != "kept" {
			t.Errorf("after unpause: %q", got)
		}
	})
}
