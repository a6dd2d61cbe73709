package airlock

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/checkpoint"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Checkpoint errors; test them with errors.Is.
var (
	// ErrCheckpointNotFound: the box has no checkpoint of that name.
	ErrCheckpointNotFound = checkpoint.ErrNotFound
	// ErrCheckpointExists: the box has a checkpoint of that name already.
	ErrCheckpointExists = checkpoint.ErrExists
	// ErrRolledBack: an Exec ended because its box was rolled back.
	ErrRolledBack = checkpoint.ErrRolledBack
)

// CheckpointInfo describes a checkpoint of a box (Box.Checkpoint).
type CheckpointInfo struct {
	Name string
	// Parent is the checkpoint the box was at when this one was taken:
	// the last one taken or rolled back to ("" for a root).
	Parent  string
	Created time.Time
	// Current: the box was last checkpointed at or rolled back to it.
	Current bool
	// StateBytes is the memory and device state on disk, DiskBytes the
	// writable layer's copy (bytes allocated); Paused is how long the box
	// stood still while it was taken.
	StateBytes, DiskBytes int64
	Paused                time.Duration
}

// Checkpoint saves the running box's memory, devices and writable layer,
// at one paused instant, as its checkpoint name (1-64 letters, digits, '.',
// '_', '-'), stored in its box directory and removed with it; the box runs
// on. Its parent is the checkpoint the box was last checkpointed at or
// rolled back to. It pauses the box about as long as Snapshot does.
// Errors: ErrInvalidArgument for a bad name, ErrCheckpointExists,
// ErrBoxNotRunning; boxes with volumes are refused (as by Snapshot).
func (b *Box) Checkpoint(ctx context.Context, name string) (CheckpointInfo, error) {
	if err := checkpoint.CheckName(name); err != nil {
		return CheckpointInfo{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	sn, err := b.r.snapshotter()
	if err != nil {
		return CheckpointInfo{}, err
	}
	if _, cfg := b.snapshot(); len(cfg.Options.Volumes) > 0 {
		return CheckpointInfo{}, fmt.Errorf("box %s has volumes: boxes with volumes cannot be checkpointed (QEMU cannot save a mounted share)", b.id)
	}
	rec, unlock, err := b.lockLoad(ctx)
	defer unlock()
	if err != nil {
		return CheckpointInfo{}, err
	}
	if !running(rec) {
		return CheckpointInfo{}, fmt.Errorf("%w: %s: start it to checkpoint it", ErrBoxNotRunning, b.id)
	}
	spec, err := b.specWithDisks(ctx, rec)
	if err != nil {
		return CheckpointInfo{}, err
	}
	m, err := checkpoint.Of(b.dir).Create(name, func(tmp string) (checkpoint.Meta, error) {
		st, err := b.saveFrozen(ctx, sn, spec, rec, tmp, vmm.SaveOptions{})
		return checkpoint.Meta{StateBytes: st.StateBytes, DiskBytes: st.DiskBytes, PausedNs: st.PausedNs}, err
	})
	if err != nil {
		return CheckpointInfo{}, fmt.Errorf("checkpoint box %s: %w", b.id, err)
	}
	return checkpointInfo(m, name), nil
}

func checkpointInfo(m checkpoint.Meta, head string) CheckpointInfo {
	return CheckpointInfo{Name: m.Name, Parent: m.Parent, Created: m.Created, Current: m.Name == head,
		StateBytes: m.StateBytes, DiskBytes: m.DiskBytes, Paused: time.Duration(m.PausedNs)}
}

// Checkpoints returns the box's checkpoints, oldest first.
func (b *Box) Checkpoints() ([]CheckpointInfo, error) {
	t := checkpoint.Of(b.dir)
	list, err := t.List()
	out := make([]CheckpointInfo, 0, len(list))
	for _, m := range list {
		out = append(out, checkpointInfo(m, t.Head()))
	}
	return out, err
}

// RemoveCheckpoint deletes the box's checkpoint name. It is safe for the
// checkpoints taken after it (each holds all a rollback needs): those
// whose parent it was get its parent. Errors: ErrCheckpointNotFound.
func (b *Box) RemoveCheckpoint(ctx context.Context, name string) error {
	unlock, err := b.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return checkpoint.Of(b.dir).Remove(name)
}

// Rollback returns the box to its checkpoint name, in place: its machine
// is ended and started again from the checkpoint's memory, devices and
// writable layer, so its processes, files and memory are as they were
// then; the guest's clock is stepped to the host's and its RNG reseeded.
// The box keeps its id, name, published ports (the host ports bound,
// picked ones too), network policy and secrets. Execs running in it end with ErrRolledBack; open network
// connections do not survive. A stopped or suspended box is started at
// the checkpoint. On error the box is left stopped (Start boots it with
// the checkpoint's files if they were restored). Errors:
// ErrCheckpointNotFound, ErrNotSupported for a driver without snapshots.
func (b *Box) Rollback(ctx context.Context, name string) error {
	sn, err := b.r.snapshotter()
	if err != nil {
		return err
	}
	t := checkpoint.Of(b.dir)
	if _, err := t.Get(name); err != nil {
		return err
	}
	b.continueIfPaused(ctx) // a paused machine quits at once, too
	rec, unlock, err := b.lockLoad(ctx)
	defer unlock()
	if err != nil {
		return err
	}
	dir := t.Path(name)
	err = func() error {
		// Recorded first: execs that the stop ends say why.
		if err := t.RolledBack(name, time.Now()); err != nil {
			return err
		}
		if running(rec) { // the host ports it bound, picked ones too
			b.mu.Lock()
			b.rebind = readPorts(b.dir)
			b.mu.Unlock()
		}
		if err := b.stopLocked(ctx, 0); err != nil {
			return err
		}
		if s := b.suspendedDir(); s != "" {
			boxdir.DropSuspended(s) // replaced by the checkpoint
		}
		spec, err := b.specWithDisks(ctx, rec)
		if err != nil {
			return err
		}
		// The checkpoint's copy replaces the writable layer, which stays
		// until it has.
		if l := spec.Disks.Layer; l != "" {
			if err := os.Rename(l, l+".old"); err != nil {
				return err
			}
			defer func() { os.Rename(l+".old", l) }() // a no-op once removed
		}
		if err := sn.CreateFromSnapshot(ctx, spec, dir); err != nil {
			return err
		}
		if l := spec.Disks.Layer; l != "" {
			os.Remove(l + ".old")
		}
		if rec, err = b.load(ctx); err != nil {
			return err
		}
		if err := b.startLocked(ctx, rec, func(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
			return sn.StartFromSnapshot(ctx, spec, dir)
		}); err != nil {
			return err
		}
		return b.restored(ctx)
	}()
	if err != nil {
		return fmt.Errorf("rollback box %s to checkpoint %s: %w (the box may be left stopped: 'airlock start %s')", b.id, name, err, b.id)
	}
	return nil
}

// rolledBackErr is err, or one wrapping ErrRolledBack when the box was
// rolled back since t0 (the error of an Exec that the rollback ended).
func (b *Box) rolledBackErr(t0 time.Time, err error) error {
	if to, at := checkpoint.Of(b.dir).LastRollback(); err != nil && at.After(t0) {
		return fmt.Errorf("box %s was rolled back to checkpoint %s while this ran (%v): %w", b.id, to, err, ErrRolledBack)
	}
	return err
}
