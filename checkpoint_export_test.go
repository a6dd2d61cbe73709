package airlock_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestExportCheckpointsQEMU: a box exported with its checkpoints
// (ExportOptions.Checkpoints) imports as a new box with the same tree and
// current checkpoint, and rolls back to each: the files of the first
// checkpoint come back, then the second's; a checkpoint taken after that
// hangs off the one rolled back to.
func TestExportCheckpointsQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	r := openRuntime(t, "")
	b, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage, Name: "ckx", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	shIn(t, b, "echo a > /root/f")
	if _, err := b.Checkpoint(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	shIn(t, b, "echo b > /root/f")
	if _, err := b.Checkpoint(ctx, "B"); err != nil {
		t.Fatal(err)
	}
	shIn(t, b, "echo c > /root/f")
	var buf bytes.Buffer
	if _, err := b.Export(ctx, &buf, airlock.ExportOptions{Checkpoints: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Export(ctx, &bytes.Buffer{}, airlock.ExportOptions{Checkpoints: true, Memory: true}); err == nil {
		t.Error("export with memory and checkpoints: no error")
	}
	b.Remove(ctx, true)

	res, err := r.ImportBox(ctx, bytes.NewReader(buf.Bytes()), airlock.ImportOptions{Name: "ckx-imported"})
	if err != nil {
		t.Fatal(err)
	}
	nb := res.Box
	t.Cleanup(func() { nb.Remove(context.Background(), true) })
	if tree, cur := ckptTree(t, nb); len(tree) != 2 || tree["A"] != "" || tree["B"] != "A" || cur != "B" {
		t.Fatalf("imported box's checkpoints %v, current %q; want A <- B, current B", tree, cur)
	}
	if err := nb.Rollback(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	if got := shIn(t, nb, "cat /root/f"); got != "a" {
		t.Errorf("after rollback to A: /root/f = %q, want a", got)
	}
	if err := nb.Rollback(ctx, "B"); err != nil {
		t.Fatal(err)
	}
	if got := shIn(t, nb, "cat /root/f"); got != "b" {
		t.Errorf("after rollback to B: /root/f = %q, want b", got)
	}
	if err := nb.Rollback(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	if _, err := nb.Checkpoint(ctx, "C"); err != nil {
		t.Fatal(err)
	}
	if tree, cur := ckptTree(t, nb); len(tree) != 3 || tree["C"] != "A" || cur != "C" {
		t.Errorf("after rollback to A and checkpoint C: %v, current %q; want C's parent A", tree, cur)
	}
}
