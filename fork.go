package airlock

import (
	"context"
	"fmt"
	"time"

	"github.com/airlock-run/airlock/internal/checkpoint"
	"github.com/airlock-run/airlock/internal/secrets"
	"github.com/airlock-run/airlock/internal/snapmeta"
	"github.com/airlock-run/airlock/internal/vmm"
)

// ForkOptions tune Box.Fork.
type ForkOptions struct {
	// AutoRemove makes each child an AutoRemove box
	// (BoxOptions.AutoRemove): removed by the next Open once the process
	// that forked it is gone (codebox.CodeBox.Fork sets it).
	AutoRemove bool
	// FromCheckpoint starts the children from the box's checkpoint of
	// that name (Box.Checkpoint) instead of from the box as it is now,
	// which is left alone and need not run. Errors: ErrCheckpointNotFound.
	FromCheckpoint string
}

// ForkWith is Fork with options.
//
// Deprecated: use Fork(ctx, n, opts).
func (b *Box) ForkWith(ctx context.Context, n int, opts ForkOptions) ([]*Box, error) {
	return b.fork(ctx, n, opts)
}

// fork is Fork with its options.
func (b *Box) fork(ctx context.Context, n int, opts ForkOptions) ([]*Box, error) {
	if n < 1 || n > MaxForks {
		return nil, fmt.Errorf("%w: fork into %d boxes: want 1..%d", ErrInvalidArgument, n, MaxForks)
	}
	name := snapmeta.TempName("fork-" + b.id)
	if opts.FromCheckpoint != "" {
		// The checkpoint, whole, as a snapshot for the children.
		if err := checkpoint.CheckName(opts.FromCheckpoint); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		if err := b.snapshotOfCheckpoint(ctx, opts.FromCheckpoint, name); err != nil {
			return nil, fmt.Errorf("fork box %s from checkpoint %s: %w", b.id, opts.FromCheckpoint, err)
		}
	} else if _, err := b.snapshotWith(ctx, name, vmm.SaveOptions{Transient: true}); err != nil {
		// A transient snapshot: its RAM stays in this process's memory,
		// which the children map copy-on-write, shared, and nothing is
		// fsynced.
		return nil, err
	}
	defer b.r.RemoveSnapshot(context.WithoutCancel(ctx), name)
	// Children get the box's lease and idle timeout and what is left of
	// its TTL.
	_, cfg := b.snapshot()
	life := BoxOptions{FromSnapshot: name, AutoRemove: opts.AutoRemove, IdleTimeout: cfg.Options.IdleTimeout, IdleAction: cfg.Options.IdleAction, Lease: cfg.Options.Lease}
	if !cfg.ExpiresAt.IsZero() {
		life.TTL = max(time.Until(cfg.ExpiresAt), time.Millisecond)
	}
	// And its secrets, with placeholders and a CA of their own (what the
	// snapshot's processes hold are the box's placeholders, which the
	// children's network helpers do not replace).
	values, err := secrets.Values(b.dir, cfg.Options.Secrets)
	if err != nil {
		return nil, fmt.Errorf("fork box %s: %w", b.id, err)
	}
	life.Secrets = values
	var none BoxOptions
	kids, err := b.r.maker(&none, "").Fork(ctx, n, removedForkFailed, func(ctx context.Context) (*Box, error) { return b.r.Create(ctx, life) })
	if err != nil {
		return nil, fmt.Errorf("fork box %s: %w", b.id, err)
	}
	ids := make([]string, len(kids))
	for i, k := range kids {
		ids[i] = k.id
	}
	b.emit(Event{Type: EventBoxForked, Children: ids})
	return kids, nil
}

// MaxForks bounds Box.Fork's n.
const MaxForks = 64

// Fork snapshots the box (pausing it for as long as Snapshot does) and
// starts n boxes from that snapshot: independent boxes, each with its own
// writable layer, running on from the same instant with the same
// processes (a background process keeps its pid; files written before
// are there), unnamed, with the box's options. The snapshot is removed
// afterwards. On error no child is left. opts (at most one) tunes the
// children. Errors: those of Snapshot and Create; ErrInvalidArgument for
// n outside 1..MaxForks or more than one opts.
func (b *Box) Fork(ctx context.Context, n int, opts ...ForkOptions) ([]*Box, error) {
	var o ForkOptions
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return nil, fmt.Errorf("%w: fork: %d ForkOptions, want at most one", ErrInvalidArgument, len(opts))
	}
	return b.fork(ctx, n, o)
}
