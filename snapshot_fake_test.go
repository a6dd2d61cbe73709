package airlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// fakeFiles returns, for a box of home on the fake driver, the host
// directory that is its writable layer (fake.FilesDir), and a function
// that runs script in the box with $F set to it.
func fakeFiles(t *testing.T, home string, b *airlock.Box) (dir string, sh func(script string) string) {
	dir = fake.FilesDir(filepath.Join(home, "boxes", b.ID()))
	return dir, func(script string) string {
		t.Helper()
		res, err := b.Exec(context.Background(), "sh", []string{"-c", script}, airlock.ExecOptions{Env: []string{"F=" + dir}, Timeout: time.Minute})
		if err != nil {
			t.Fatalf("box %s: exec %q: %v", b.ID(), script, err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("box %s: exec %q: exit %d, stderr %q", b.ID(), script, res.ExitCode, res.Stderr)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
}

// TestSnapshotOnFake: the lifecycle code's snapshots, restores, forks,
// pauses and pauses to disk, on the FAKE driver with those abilities
// (fake.Snapshotting: a box's writable layer is a host directory of its
// own; a restore has the snapshot's files but, unlike a VM's, none of its
// processes). A snapshot is listed and restores into boxes with the
// files as they were, each with a layer of its own; a restore that asks
// for another machine is refused; removing the snapshot leaves its boxes
// working across a stop and start; Fork makes independent children and
// leaves no snapshot; a paused box runs no command until resumed, is
// refused a pause to disk and stops at once; a box paused to disk has no
// machine, says so, and resumes (or stops and starts) with its files.
func TestSnapshotOnFake(t *testing.T) {
	ctx := context.Background()
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	home := t.TempDir()
	r := h.open(t, home)
	create := func(t *testing.T, o airlock.BoxOptions) *airlock.Box {
		t.Helper()
		b, err := r.Create(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Remove(context.Background(), true) })
		return b
	}
	parent := create(t, airlock.BoxOptions{Image: h.image, Labels: map[string]string{"team": "a"}})
	_, psh := fakeFiles(t, home, parent)
	psh(`echo before > "$F/f"`)

	snap, err := parent.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if snap.Driver != "fake" || snap.StateBytes <= 0 || snap.DiskBytes <= 0 || snap.AgentVersion == "" || snap.Box != parent.ID() {
		t.Fatalf("snapshot info: %+v", snap)
	}
	if _, err := parent.Snapshot(ctx, "s1"); !errors.Is(err, airlock.ErrSnapshotExists) {
		t.Fatalf("second snapshot of the same name: %v", err)
	}
	if list, err := r.Snapshots(ctx); err != nil || len(list) != 1 || list[0].Name != "s1" {
		t.Fatalf("snapshots: %+v %v", list, err)
	}
	// The parent runs on; what it writes now is not in the snapshot.
	psh(`echo after > "$F/after"`)

	c1 := create(t, airlock.BoxOptions{FromSnapshot: "s1"})
	c2 := create(t, airlock.BoxOptions{FromSnapshot: "s1", Labels: map[string]string{"team": "b"}})
	t.Run("labels are the snapshot's box's unless given", func(t *testing.T) {
		for b, want := range map[*airlock.Box]string{c1: "a", c2: "b"} {
			info, err := b.Info(ctx)
			if err != nil || info.Options.Labels["team"] != want || len(info.Options.Labels) != 1 {
				t.Errorf("box %s: labels %v %v, want team=%s", b.ID(), info.Options.Labels, err, want)
			}
		}
	})
	_, sh1 := fakeFiles(t, home, c1)
	_, sh2 := fakeFiles(t, home, c2)
	t.Run("restored boxes have the snapshot's files, each its own", func(t *testing.T) {
		if c1.ID() == c2.ID() || c1.ID() == parent.ID() {
			t.Fatalf("ids %s %s of the parent %s", c1.ID(), c2.ID(), parent.ID())
		}
		for _, sh := range []func(string) string{sh1, sh2} {
			if got := sh(`cat "$F/f"; test ! -e "$F/after" && echo no-after`); got != "before\nno-after" {
				t.Errorf("restored box's files: %q", got)
			}
		}
		sh1(`echo one > "$F/c1"`)
		if got := sh2(`test ! -e "$F/c1" && echo alone`); got != "alone" {
			t.Errorf("c2 sees c1's file: %q", got)
		}
		if got := psh(`test ! -e "$F/c1" && echo alone`); got != "alone" {
			t.Errorf("the parent sees c1's file: %q", got)
		}
	})
	t.Run("a restore that asks for another machine is refused", func(t *testing.T) {
		if _, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: "s1", MemoryMiB: 1024}); err == nil || !strings.Contains(err.Error(), "MemoryMiB") {
			t.Fatalf("restore with other memory: %v", err)
		}
		if _, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: "nope"}); !errors.Is(err, airlock.ErrSnapshotNotFound) {
			t.Fatalf("restore of a missing snapshot: %v", err)
		}
	})
	t.Run("removing a snapshot leaves its boxes working", func(t *testing.T) {
		if err := r.RemoveSnapshot(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Snapshot(ctx, "s1"); !errors.Is(err, airlock.ErrSnapshotNotFound) {
			t.Fatalf("removed snapshot: %v", err)
		}
		if err := c1.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c1.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := sh1(`cat "$F/f" "$F/c1"`); got != "before\none" {
			t.Errorf("c1 started again: %q", got)
		}
	})
	t.Run("fork", func(t *testing.T) {
		kids, err := parent.Fork(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range kids {
			t.Cleanup(func() { k.Remove(context.Background(), true) })
		}
		if len(kids) != 2 || kids[0].ID() == kids[1].ID() {
			t.Fatalf("children: %v", kids)
		}
		_, k0 := fakeFiles(t, home, kids[0])
		_, k1 := fakeFiles(t, home, kids[1])
		for _, sh := range []func(string) string{k0, k1} {
			if got := sh(`cat "$F/f" "$F/after"`); got != "before\nafter" {
				t.Errorf("child's files: %q", got)
			}
		}
		k0(`echo 0 > "$F/kid0"`)
		if got := k1(`test ! -e "$F/kid0" && echo alone`); got != "alone" {
			t.Errorf("a child sees its sibling's file: %q", got)
		}
		if list, _ := r.Snapshots(ctx); len(list) != 0 {
			t.Errorf("fork left snapshots behind: %+v", list)
		}
		if got := psh("echo parent-ok"); got != "parent-ok" {
			t.Errorf("parent after fork: %q", got)
		}
	})
	t.Run("pause", func(t *testing.T) {
		if err := c2.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if p, err := c2.Paused(ctx); err != nil || !p {
			t.Fatalf("paused: %v %v", p, err)
		}
		// A call into a paused box is refused at once, naming unpause (it
		// waited for the box to run again, or a fresh process's
		// handshake timed out after about 31 s): an exec, and a file call.
		if _, err := c2.Exec(ctx, "true", nil, airlock.ExecOptions{}); !errors.Is(err, airlock.ErrBoxPaused) || !strings.Contains(err.Error(), "airlock unpause "+c2.ID()) {
			t.Errorf("exec in a paused box: %v; want ErrBoxPaused naming airlock unpause", err)
		}
		if _, err := c2.ReadFile(ctx, "/etc/hostname"); !errors.Is(err, airlock.ErrBoxPaused) {
			t.Errorf("read a file of a paused box: %v; want ErrBoxPaused", err)
		}
		// Another handle (as another process gets) is refused too.
		if o, err := r.Get(ctx, c2.ID()); err != nil {
			t.Fatal(err)
		} else if _, err := o.Exec(ctx, "true", nil, airlock.ExecOptions{}); !errors.Is(err, airlock.ErrBoxPaused) {
			t.Errorf("exec in a paused box through a new handle: %v; want ErrBoxPaused", err)
		}
		t0 := time.Now()
		if err := c2.Suspend(ctx); err == nil || !strings.Contains(err.Error(), "unpause it first") || time.Since(t0) > 5*time.Second {
			t.Errorf("suspend of a paused box: %v after %s; want a refusal at once", err, time.Since(t0))
		}
		if err := c2.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if p, err := c2.Paused(ctx); err != nil || p {
			t.Fatalf("paused after Resume: %v %v", p, err)
		}
		if _, err := c2.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil {
			t.Fatalf("exec after Resume: %v", err)
		}
		if got := sh2(`cat "$F/f"`); got != "before" {
			t.Errorf("after Resume: %q", got)
		}
		// Paused again, a stop shuts it down at once, not after its grace.
		if err := c2.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		t0 = time.Now()
		if err := c2.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("stop of a paused box took %s", d)
		}
	})
	t.Run("suspend", func(t *testing.T) {
		before, err := parent.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := parent.Suspend(ctx); err != nil {
			t.Fatal(err)
		}
		info, err := parent.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State != "stopped" || !info.Suspended || info.PID != 0 {
			t.Fatalf("after Suspend: state %q, suspended %v, pid %d", info.State, info.Suspended, info.PID)
		}
		if raw, err := os.ReadFile("/proc/" + strconv.Itoa(before.PID) + "/cmdline"); err == nil && strings.Contains(string(raw), parent.ID()) {
			t.Errorf("the box's agent (pid %d) still runs after Suspend", before.PID)
		}
		if _, err := parent.Exec(ctx, "true", nil, airlock.ExecOptions{}); !errors.Is(err, airlock.ErrBoxNotRunning) || !strings.Contains(err.Error(), "paused to disk") {
			t.Errorf("exec in a box paused to disk: %v", err)
		}
		if err := parent.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if info, _ := parent.Info(ctx); info.State != "running" || info.Suspended {
			t.Errorf("after Resume: state %q, suspended %v", info.State, info.Suspended)
		}
		if got := psh(`cat "$F/f" "$F/after"`); got != "before\nafter" {
			t.Errorf("files after Resume: %q", got)
		}
		if _, err := os.Stat(filepath.Join(home, "boxes", parent.ID(), "suspended")); !os.IsNotExist(err) {
			t.Errorf("the saved state is still there after Resume: %v", err)
		}
		// Paused to disk again, then stopped: the saved state goes, the
		// box starts with its files.
		psh(`echo late > "$F/late"`)
		if err := parent.Suspend(ctx); err != nil {
			t.Fatal(err)
		}
		if err := parent.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if info, _ := parent.Info(ctx); info.Suspended || info.State != "stopped" {
			t.Fatalf("after Stop: state %q, suspended %v", info.State, info.Suspended)
		}
		if err := parent.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := psh(`cat "$F/f" "$F/late"`); got != "before\nlate" {
			t.Errorf("files after Stop and Start: %q", got)
		}
	})
}
