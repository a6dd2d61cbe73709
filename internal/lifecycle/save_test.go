package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// pausing is a driver whose machine can be paused and saved; saveErr
// fails its saves.
type pausing struct {
	*driver
	mu      sync.Mutex
	paused  bool
	pauses  []bool // paused at each save
	saveErr error
}

func (d *pausing) Pause(context.Context, vmm.Spec, vmm.Handle) error {
	d.mu.Lock()
	d.paused = true
	d.mu.Unlock()
	return nil
}
func (d *pausing) Resume(context.Context, vmm.Spec, vmm.Handle) error {
	d.mu.Lock()
	d.paused = false
	d.mu.Unlock()
	return nil
}
func (d *pausing) Paused(context.Context, vmm.Spec, vmm.Handle) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.paused, nil
}
func (d *pausing) isPaused() bool {
	p, _ := d.Paused(context.Background(), vmm.Spec{}, vmm.Handle{})
	return p
}
func (d *pausing) SaveSnapshot(ctx context.Context, s vmm.Spec, h vmm.Handle, dir string, o vmm.SaveOptions) (vmm.SnapshotStats, error) {
	d.mu.Lock()
	d.pauses = append(d.pauses, d.paused)
	d.mu.Unlock()
	if d.saveErr != nil {
		return vmm.SnapshotStats{}, d.saveErr
	}
	return vmm.SnapshotStats{}, os.WriteFile(filepath.Join(dir, "state"), []byte("saved"), 0o600)
}
func (d *pausing) CheckSnapshot(vmm.Spec, string) error                       { return nil }
func (d *pausing) CreateFromSnapshot(context.Context, vmm.Spec, string) error { return nil }
func (d *pausing) StartFromSnapshot(context.Context, vmm.Spec, string) (vmm.Machine, error) {
	return nil, errors.New("no restore here")
}

// running makes b's record say its machine runs.
func (b *box) running(t *testing.T) *store.Box {
	h := b.drv.m.Handle()
	if err := b.DB.SetRunning(context.Background(), b.ID, h.PID, h.Start, time.Now()); err != nil {
		t.Fatal(err)
	}
	rec := b.stored()
	b.setRecord(rec)
	return rec
}

func pausingBox(t *testing.T) (*box, *pausing) {
	b := newBox(t)
	d := &pausing{driver: b.drv}
	b.Drv = d
	return b, d
}

func TestPausedAndContinue(t *testing.T) {
	b, d := pausingBox(t)
	ctx := context.Background()
	if b.Box.Paused(ctx, b.record()) {
		t.Error("a box that never ran is paused")
	}
	rec := b.running(t)
	d.Pause(ctx, vmm.Spec{}, vmm.Handle{})
	if !b.Box.Paused(ctx, rec) {
		t.Fatal("a paused machine not reported paused")
	}
	b.Continue(ctx, rec)
	if d.isPaused() || b.Box.Paused(ctx, rec) {
		t.Error("Continue left the machine paused")
	}
	b.Drv = d.driver // a driver that cannot pause: never paused
	if b.Box.Paused(ctx, rec) {
		t.Error("paused on a driver without Pauser")
	}
}

func TestSuspendSavesPausedThenStops(t *testing.T) {
	b, d := pausingBox(t)
	rec := b.running(t)
	stops := 0
	err := b.Suspend(context.Background(), rec, vmm.Spec{}, d, d, func() error { stops++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(d.pauses) != 1 || !d.pauses[0] {
		t.Errorf("saves with the machine paused: %v, want one, paused", d.pauses)
	}
	if stops != 1 {
		t.Errorf("stopped %d times, want once", stops)
	}
	dir := boxdir.SuspendedIn(b.Dir)
	if dir == "" {
		t.Fatal("no saved state in the box directory")
	}
	if got, err := os.ReadFile(filepath.Join(dir, "state")); err != nil || string(got) != "saved" {
		t.Errorf("saved state %q, %v", got, err)
	}
}

func TestSuspendThatFailsLeavesTheBoxAsItWas(t *testing.T) {
	b, d := pausingBox(t)
	rec := b.running(t)
	d.saveErr = errors.New("disk full")
	err := b.Suspend(context.Background(), rec, vmm.Spec{}, d, d, func() error { t.Error("stopped after a failed save"); return nil })
	if !errors.Is(err, d.saveErr) {
		t.Fatalf("Suspend = %v, want the save's error", err)
	}
	if d.isPaused() || boxdir.SuspendedIn(b.Dir) != "" {
		t.Errorf("after a failed save: paused %v, saved state %q; want running, none", d.isPaused(), boxdir.SuspendedIn(b.Dir))
	}
	// A box paused before stays paused.
	d.Pause(context.Background(), vmm.Spec{}, vmm.Handle{})
	b.Suspend(context.Background(), rec, vmm.Spec{}, d, d, func() error { return nil })
	if !d.isPaused() {
		t.Error("a failed save resumed a box paused before it")
	}
	// A stop that fails drops the saved state: the box runs on from
	// its memory, not from a saved instant.
	d.saveErr = nil
	stopErr := errors.New("stop failed")
	if err := b.Suspend(context.Background(), rec, vmm.Spec{}, d, d, func() error { return stopErr }); !errors.Is(err, stopErr) {
		t.Fatalf("Suspend = %v, want the stop's error", err)
	}
	if s := boxdir.SuspendedIn(b.Dir); s != "" {
		t.Errorf("saved state %s kept after a failed stop", s)
	}
}

func TestStableDisk(t *testing.T) {
	b, d := pausingBox(t)
	ctx := context.Background()
	load := func(context.Context) (*store.Box, error) { return b.stored(), nil }
	flushes := 0
	flush := func(context.Context) error { flushes++; return nil }
	tmp := t.TempDir()
	if _, _, _, err := b.StableDisk(ctx, tmp, load, flush); err == nil {
		t.Error("a box without a writable layer gave a disk")
	}
	rw := filepath.Join(b.Dir, boxdir.RW)
	if err := os.WriteFile(rw, []byte("layer"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Stopped: the disk itself, the box locked until cleanup.
	disk, _, cleanup, err := b.StableDisk(ctx, tmp, load, flush)
	if err != nil || disk != rw || flushes != 0 {
		t.Fatalf("stopped box: %q, %v (flushes %d); want %q", disk, err, flushes, rw)
	}
	lctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, err := b.Lock(lctx); err == nil {
		t.Error("the box's lock is free while its disk is read")
	}
	cancel()
	cleanup()
	unlock, err := b.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	// Running: flushed, then a copy made while paused.
	b.running(t)
	disk, _, cleanup, err = b.StableDisk(ctx, tmp, load, flush)
	if err != nil || disk == rw || flushes != 1 || d.isPaused() {
		t.Fatalf("running box: %q, %v (flushes %d, paused after %v)", disk, err, flushes, d.isPaused())
	}
	if got, err := os.ReadFile(disk); err != nil || string(got) != "layer" {
		t.Errorf("copy holds %q, %v", got, err)
	}
	cleanup()
	if _, err := os.Stat(disk); !os.IsNotExist(err) {
		t.Errorf("copy left after cleanup: %v", err)
	}
	b.Drv = d.driver
	if _, _, _, err := b.StableDisk(ctx, tmp, load, flush); !errors.Is(err, vmm.ErrNotSupported) {
		t.Errorf("running box on a driver that cannot pause: %v", err)
	}
}

func TestSaveFreezesAllButAPausedBox(t *testing.T) {
	b, d := pausingBox(t)
	ctx := context.Background()
	rec := b.running(t)
	touched := 0
	touch := func() { touched++ }
	// Running: its processes are frozen first, through its agent; one
	// that does not answer fails the save before anything is written.
	if _, err := b.Save(ctx, rec, vmm.Spec{}, d, t.TempDir(), vmm.SaveOptions{}, touch); err == nil {
		t.Fatal("saved a box whose agent could not freeze its processes")
	}
	if len(d.pauses) != 0 || touched != 1 {
		t.Errorf("saves %v, touched %d; want none, one use", d.pauses, touched)
	}
	// Paused: its agent cannot answer; saved as it is.
	d.Pause(ctx, vmm.Spec{}, vmm.Handle{})
	dir := t.TempDir()
	if _, err := b.Save(ctx, rec, vmm.Spec{}, d, dir, vmm.SaveOptions{}, touch); err != nil {
		t.Fatal(err)
	}
	if len(d.pauses) != 1 || touched != 1 {
		t.Errorf("saves %v, touched %d; want one save, no further use", d.pauses, touched)
	}
	if _, err := os.Stat(filepath.Join(dir, "state")); err != nil {
		t.Error(err)
	}
}
