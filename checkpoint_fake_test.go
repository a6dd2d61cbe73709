package airlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// ckptTree returns the box's checkpoints as name -> parent, and the
// current one.
func ckptTree(t *testing.T, b *airlock.Box) (map[string]string, string) {
	t.Helper()
	list, err := b.Checkpoints()
	if err != nil {
		t.Fatal(err)
	}
	tree, cur := map[string]string{}, ""
	for _, c := range list {
		tree[c.Name] = c.Parent
		if c.Current {
			cur = c.Name
		}
	}
	return tree, cur
}

// TestCheckpointOnFake: the checkpoint tree's bookkeeping on the FAKE
// driver with snapshots (its restore brings back the files, not the
// processes: the VM test checks those). A rollback brings the files back
// in the same box (id and name kept, running); checkpoints record their
// parent, and one taken after a rollback starts a branch; removing a
// checkpoint others descend from is safe (they get its parent and still
// roll back); names are checked; an exec running at a rollback ends with
// ErrRolledBack; the checkpoints go with the box.
func TestCheckpointOnFake(t *testing.T) {
	ctx := context.Background()
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	home := t.TempDir()
	r := h.open(t, home)
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Name: "ck"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(context.Background(), true)
	_, sh := fakeFiles(t, home, b)
	ckpt := func(name string) airlock.CheckpointInfo {
		t.Helper()
		c, err := b.Checkpoint(ctx, name)
		if err != nil {
			t.Fatalf("checkpoint %s: %v", name, err)
		}
		return c
	}
	rollback := func(name string) {
		t.Helper()
		if err := b.Rollback(ctx, name); err != nil {
			t.Fatalf("rollback %s: %v", name, err)
		}
		info, err := b.Info(ctx)
		if err != nil || info.ID != b.ID() || info.Name != "ck" || info.State != airlock.BoxRunning {
			t.Fatalf("after rollback %s: %+v %v", name, info, err)
		}
	}

	sh(`echo a > "$F/v"`)
	if c := ckpt("A"); c.Parent != "" || !c.Current || c.DiskBytes <= 0 {
		t.Fatalf("A: %+v", c)
	}
	sh(`echo b > "$F/v"; echo new > "$F/only-b"`)
	if c := ckpt("B"); c.Parent != "A" {
		t.Fatalf("B: %+v, want parent A", c)
	}
	if _, err := b.Checkpoint(ctx, "B"); !errors.Is(err, airlock.ErrCheckpointExists) {
		t.Fatalf("B again: %v", err)
	}
	for _, bad := range []string{"", "../x", ".hidden", "a b", strings.Repeat("n", 65)} {
		if _, err := b.Checkpoint(ctx, bad); !errors.Is(err, airlock.ErrInvalidArgument) {
			t.Errorf("checkpoint %q: %v, want ErrInvalidArgument", bad, err)
		}
	}
	if err := b.Rollback(ctx, "nope"); !errors.Is(err, airlock.ErrCheckpointNotFound) {
		t.Fatalf("rollback to a missing checkpoint: %v", err)
	}

	// An exec running at the rollback ends saying so.
	p, err := b.ExecStart(ctx, "sleep", []string{"300"}, airlock.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rollback("A")
	select {
	case <-p.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("the exec running at the rollback did not end")
	}
	if _, err := p.Wait(); !errors.Is(err, airlock.ErrRolledBack) {
		t.Fatalf("exec across the rollback: %v, want ErrRolledBack", err)
	}
	if got := sh(`cat "$F/v"; ls "$F"`); got != "a\nv" {
		t.Fatalf("after rollback A: %q, want the file as at A and no only-b", got)
	}
	// A checkpoint after a rollback starts a branch.
	sh(`echo c > "$F/v"`)
	if c := ckpt("C"); c.Parent != "A" {
		t.Fatalf("C: %+v, want parent A (a branch)", c)
	}
	rollback("B")
	if got := sh(`cat "$F/v" "$F/only-b"`); got != "b\nnew" {
		t.Fatalf("after rollback B: %q", got)
	}
	if tree, cur := ckptTree(t, b); len(tree) != 3 || tree["A"] != "" || tree["B"] != "A" || tree["C"] != "A" || cur != "B" {
		t.Fatalf("tree %v current %q, want B and C children of A, B current", tree, cur)
	}
	// Removing A, which B and C descend from, is safe.
	if err := b.RemoveCheckpoint(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	if tree, _ := ckptTree(t, b); len(tree) != 2 || tree["B"] != "" || tree["C"] != "" {
		t.Fatalf("after removing A: %v, want B and C as roots", tree)
	}
	rollback("C")
	if got := sh(`cat "$F/v"`); got != "c" {
		t.Fatalf("after rollback C: %q", got)
	}
	if err := b.RemoveCheckpoint(ctx, "A"); !errors.Is(err, airlock.ErrCheckpointNotFound) {
		t.Fatalf("remove A again: %v", err)
	}

	// A stopped box is started at the checkpoint.
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rollback("B")
	if got := sh(`cat "$F/v"`); got != "b" {
		t.Fatalf("rollback of a stopped box: %q", got)
	}
	if err := b.Remove(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(home, "boxes", b.ID())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("box directory (with its checkpoints) after remove: %v", err)
	}
}

// TestForkFromCheckpointOnFake: Fork with FromCheckpoint starts children
// from a checkpoint, not from the box as it is: each child has the files
// as at the checkpoint, the box keeps its own (and need not run); no
// snapshot is left behind; a missing checkpoint is ErrCheckpointNotFound.
func TestForkFromCheckpointOnFake(t *testing.T) {
	ctx := context.Background()
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	home := t.TempDir()
	r := h.open(t, home)
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(context.Background(), true)
	_, sh := fakeFiles(t, home, b)
	sh(`echo a > "$F/v"`)
	if _, err := b.Checkpoint(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	sh(`echo b > "$F/v"`)
	if _, err := b.Checkpoint(ctx, "B"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Fork(ctx, 1, airlock.ForkOptions{FromCheckpoint: "nope"}); !errors.Is(err, airlock.ErrCheckpointNotFound) {
		t.Fatalf("fork from a missing checkpoint: %v, want ErrCheckpointNotFound", err)
	}
	if err := b.Stop(ctx); err != nil { // a stopped box forks from its checkpoints too
		t.Fatal(err)
	}
	kids, err := b.Fork(ctx, 2, airlock.ForkOptions{FromCheckpoint: "A"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		defer k.Remove(context.Background(), true)
		_, ksh := fakeFiles(t, home, k)
		if got := ksh(`cat "$F/v"`); got != "a" {
			t.Errorf("child %s of checkpoint A has %q, want a", k.ID(), got)
		}
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sh(`cat "$F/v"`); got != "b" {
		t.Errorf("the forked box has %q, want its own b", got)
	}
	if snaps, err := r.Snapshots(ctx); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots after a fork from a checkpoint: %v %v, want none", snaps, err)
	}
}
