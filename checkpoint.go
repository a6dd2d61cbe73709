package airlock

import (
	"context"
	"fmt"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/checkpoint"
	"github.com/airlock-run/airlock/internal/store"
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

// CheckpointInfo describes a checkpoint of a box (Box.Checkpoint): Parent
// is the checkpoint the box was at when it was taken ("" for a root),
// Current says the box was last checkpointed at or rolled back to it.
type CheckpointInfo = checkpoint.Info

// Checkpoint saves the running box's memory, devices and writable layer,
// at one paused instant, as its checkpoint name (1-64 letters, digits, '.',
// '_', '-'), stored in its box directory and removed with it; the box runs
// on. Its parent is the checkpoint the box was last checkpointed at or
// rolled back to; the QEMU driver stores only the memory pages and disk
// blocks that changed since the parent (docs/snapshots.md).
// Errors: ErrInvalidArgument for a bad name, ErrCheckpointExists,
// ErrBoxNotRunning; boxes with volumes are refused (as by Snapshot).
func (b *Box) Checkpoint(ctx context.Context, name string) (CheckpointInfo, error) {
	if err := checkpoint.CheckName(name); err != nil {
		return CheckpointInfo{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	var m checkpoint.Meta
	// Stored as what changed since the box's current checkpoint (the
	// driver's choice; a whole one where it cannot).
	t := checkpoint.Of(b.dir)
	opts := vmm.SaveOptions{Chain: true}
	if head := t.Head(); head != "" {
		opts.Parent = t.Path(head)
	}
	err := b.withSave(ctx, "checkpoint", "checkpointed", opts, func(rec *store.Box, save func(string) (vmm.SnapshotStats, error)) (err error) {
		av, err := b.snapshotAgentVersion(ctx, rec)
		if err != nil {
			return err
		}
		m, err = t.Create(name, func(tmp string) (checkpoint.Meta, error) {
			st, err := save(tmp)
			return checkpoint.Meta{StateBytes: st.StateBytes, DiskBytes: st.DiskBytes, PausedNs: st.PausedNs, AgentVersion: av}, err
		})
		return err
	})
	if err != nil {
		return CheckpointInfo{}, fmt.Errorf("checkpoint box %s: %w", b.id, err)
	}
	b.emit(Event{Type: EventBoxCheckpointed, Snapshot: name})
	return m.Info(name), nil
}

// Checkpoints returns the box's checkpoints, oldest first.
func (b *Box) Checkpoints() ([]CheckpointInfo, error) { return checkpoint.Of(b.dir).Infos() }

// CheckpointsSize returns the bytes the box's checkpoints take on disk
// (allocated; a checkpoint stored as changes takes only those), what a
// server counts against a tenant's disk quota.
func (b *Box) CheckpointsSize() int64 { return checkpoint.Of(b.dir).Bytes() }

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

// Rollback returns the box in place to its checkpoint name: its machine
// starts again from the checkpoint, processes, files and memory as they
// were, the clock stepped to the host's and the RNG reseeded. It keeps
// its id, name, published ports (picked host ports too), network policy
// and secrets. Execs running in it end with ErrRolledBack; connections
// are cut. A stopped or suspended box starts at the checkpoint; on error
// it may be left stopped. Errors: ErrCheckpointNotFound, ErrNotSupported.
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
	if err == nil {
		err = b.rollbackLocked(ctx, sn, rec, t, name)
	}
	if err != nil {
		return fmt.Errorf("rollback box %s to checkpoint %s: %w (the box may be left stopped: 'airlock start %s')", b.id, name, err, b.id)
	}
	return nil
}

// rollbackLocked is Rollback with the box's lock held, rec its record
// (lifecycle.Box.Rollback).
func (b *Box) rollbackLocked(ctx context.Context, sn vmm.Snapshotter, rec *store.Box, t checkpoint.Tree, name string) error {
	return b.eng.Rollback(ctx, sn, t, name, func() error {
		if running(rec) { // the host ports it bound, picked ones too
			b.mu.Lock()
			b.rebind = readPorts(b.dir)
			b.mu.Unlock()
		}
		was, err := b.stopLocked(ctx, 0)
		if was {
			b.emit(Event{Type: EventBoxStopped})
		}
		return err
	}, func() (vmm.Spec, error) { return b.specWithDisks(ctx, rec) }, func(machine func(context.Context, vmm.Spec) (vmm.Machine, error)) error {
		rec, err := b.load(ctx)
		if err == nil {
			err = b.startLocked(ctx, rec, machine, EventBoxRolledBack)
		}
		if err == nil {
			err = b.restored(ctx)
		}
		return err
	})
}

// snapshotOfCheckpoint makes snapshot name (under Home/snapshots) of the
// box's checkpoint ckpt, whole (Tree.Flatten), with the box's record and
// options, for Fork's children (ForkOptions.FromCheckpoint). The box need
// not run (lifecycle.Box.CheckpointSnapshot). Errors:
// ErrCheckpointNotFound.
func (b *Box) snapshotOfCheckpoint(ctx context.Context, ckpt, name string) error {
	if _, err := b.r.snapshotter(); err != nil {
		return err
	}
	rec, unlock, err := b.lockLoad(ctx) // no removal of the checkpoint meanwhile
	defer unlock()
	if err != nil {
		return err
	}
	_, cfg := b.snapshot()
	return b.eng.CheckpointSnapshot(ctx, b.r.snapshotsDir(), name, ckpt, rec, encodeConfig(cfg), agentpb.Version)
}
