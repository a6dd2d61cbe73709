package airlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/friend"
	"github.com/airlock-run/airlock/internal/pool"
	"github.com/airlock-run/airlock/internal/vmm"
)

// PoolOptions configure a warm pool (Options.Pool): Size boxes of
// BoxOptions kept ready, so that Create with the same options takes one
// instead of booting. Boxes are restored from a template snapshot (made
// when the runtime opens: a box of these options booted, Prepare run in
// it, snapshotted and removed), or booted, with Prepare run in each, where
// the VM driver cannot snapshot.
type PoolOptions struct {
	// BoxOptions are what the pool's boxes are. Name, Hostname,
	// AutoRemove and FromSnapshot are ignored (a claim takes the caller's
	// Name, Hostname and AutoRemove); Volumes, Ports and Secrets are
	// refused (a pooled box must not hold host directories or host ports,
	// and a box with secrets has its own CA from its creation).
	BoxOptions
	// Size is how many boxes are kept ready (1..MaxPoolSize).
	Size int
	// Prepare, when set, runs in the template box before its snapshot (in
	// each booted box where the driver cannot snapshot). What it starts
	// there, every box of the pool has. codebox.Pool uses it to start a
	// Python kernel.
	Prepare func(ctx context.Context, b *Box) error

	// warm is codebox's hook on each box once it is up (friend.PoolWarm).
	warm func(ctx context.Context, b *Box) (any, error)
}

// The hooks of codebox's pools (internal/friend): no public API.
func init() {
	friend.PoolWarm = func(po any, warm func(ctx context.Context, box any) (any, error)) {
		po.(*PoolOptions).warm = func(ctx context.Context, b *Box) (any, error) { return warm(ctx, b) }
	}
	friend.TakeWarm = func(b any) any { return b.(*Box).r.pool.TakeWarm(b.(*Box).id) }
}

// MaxPoolSize bounds PoolOptions.Size.
const MaxPoolSize = 64

// DefaultPoolFills is the default of Options.PoolFills.
const DefaultPoolFills = 2

// PoolInfo is the state of one warm pool (Runtime.Pools).
type PoolInfo struct {
	Image string
	// Key identifies the pool's box options (a hash).
	Key string
	// Size is the target; Ready the boxes that can be claimed now; Filling
	// those being restored or booted.
	Size, Ready, Filling int
	// Template is the template snapshot's name ("" while none is made, or
	// when boxes are booted); Booted is true when the driver cannot
	// snapshot and pool boxes are booted.
	Template string
	Booted   bool
	// Claimed counts boxes taken by Create since the runtime opened.
	Claimed int
	// LastError is the last failure to fill the pool ("" when none, or the
	// last fill succeeded).
	LastError string
	// HeldBack says why the pool is not being filled although it is below
	// its size: a host cap (Options.MaxBoxes, Options.MaxMemoryMiB) or the
	// home's budget (Options.PoolMaxHomeBoxes) is reached ("" when not).
	// It is no failure: the pool fills again once there is room.
	HeldBack string
	// Evicted counts ready boxes removed to make room for a box started
	// past a cap (see docs/pool.md, "Caps").
	Evicted int
	// Boxes are the ids of the ready boxes, oldest first (List does not
	// show them).
	Boxes []string
}

// poolKey is the key of the pool that boxes of opts come from, and opts
// with defaults; ok is false when opts cannot come from a pool
// (boxopts.PoolKey).
func poolKey(opts BoxOptions) (key string, o BoxOptions, ok bool) {
	key, p, ok := boxopts.PoolKey(opts.plain())
	if !ok {
		return "", opts, false
	}
	return key, public(p), true
}

// newPools checks opts.Pool and makes the runtime's pools (not started).
func newPools(r *Runtime, opts Options) (*pool.Set[*Box], error) {
	if len(opts.Pool) == 0 {
		return nil, nil
	}
	fills := opts.PoolFills
	if fills <= 0 {
		fills = DefaultPoolFills
	}
	var specs []pool.Spec[*Box]
	seen := map[string]bool{}
	for i, po := range opts.Pool {
		key, o, err := boxopts.Pool(po.BoxOptions.plain(), po.Size, MaxPoolSize)
		if err == nil && seen[key] {
			err = fmt.Errorf("%w: another pool has the same box options; give it a larger size instead", ErrInvalidArgument)
		}
		if err != nil {
			return nil, fmt.Errorf("pool %d (%s): %w", i, po.Image, err)
		}
		seen[key] = true
		po.BoxOptions = public(o)
		specs = append(specs, pool.Spec[*Box]{Key: key, Name: po.Image, Size: po.Size, MemoryMiB: o.MemoryMiB,
			Factory: r.poolMaker(key, po)})
	}
	return pool.New(specs, r.caps(max(opts.PoolMaxHomeBoxes, 0)), pool.Options{Fills: fills, Warn: r.warn, Live: r.holds}), nil
}

// poolMaker makes the boxes of the warm pool of key and po (BoxOptions
// with defaults; pool.Maker): boxes recorded with the pool's key as their
// mark (boxConfig.Pool), which keeps them out of List and Get until
// claimed; restored from a template snapshot named pool.TemplateName with
// this process's pid and start time.
func (r *Runtime) poolMaker(key string, po PoolOptions) *pool.Maker[*Box] {
	return &pool.Maker[*Box]{
		CanSnapshot: func() error { _, err := r.snapshotter(); return err },
		New:         func(ctx context.Context) (*Box, error) { return r.create(ctx, po.BoxOptions, key) },
		Prepare:     po.Prepare,
		TemplateName: func() string {
			pid := os.Getpid()
			return pool.TemplateName(key, pid, vmm.StartTime(pid), newID()[:6])
		},
		Snapshot: func(ctx context.Context, b *Box, name string) error {
			_, err := b.Snapshot(ctx, name)
			return err
		},
		NotSupported: vmm.ErrNotSupported,
		FromTemplate: func(ctx context.Context, template string) (*Box, error) {
			return r.restore(ctx, BoxOptions{FromSnapshot: template, AutoRemove: true}, key)
		},
		WarmUp: func(ctx context.Context, b *Box) (any, error) {
			if po.warm != nil {
				return po.warm(ctx, b)
			}
			// A plain pool box runs `true` once, so that its restored
			// QEMU has translated the exec path before a claimer's first
			// command does (TCG: ~100 ms). Best effort: an image without
			// `true` makes a pool box like any other.
			b.Exec(ctx, "true", nil, ExecOptions{})
			return nil, nil
		},
		Delete:         func(ctx context.Context, b *Box) error { return b.remove(ctx, true) },
		DeleteTemplate: r.RemoveSnapshot,
	}
}

// holds reports whether the runtime holds a handle for box id (it was
// not removed or closed).
func (r *Runtime) holds(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.boxes[id]
	return ok
}

// startPools removes the template snapshots that crashed runtimes left
// and starts filling the pools.
func (r *Runtime) startPools() {
	if r.pool == nil {
		return
	}
	r.removeStaleTemplates(context.Background())
	r.pool.Start()
}

// stopPools ends the fills, waits for them, and removes the unclaimed
// boxes and the templates.
func (r *Runtime) stopPools() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.pool.Stop(ctx)
}

// removeStaleTemplates removes the template snapshots whose runtime's
// process is gone (pool.TemplateOwner).
func (r *Runtime) removeStaleTemplates(ctx context.Context) {
	snaps, err := r.Snapshots(ctx)
	if err != nil {
		return
	}
	for _, sn := range snaps {
		if pid, st, ok := pool.TemplateOwner(sn.Name); ok && !(vmm.Handle{PID: pid, Start: st}).Alive() {
			r.RemoveSnapshot(ctx, sn.Name)
		}
	}
}

// claimPooled takes a ready box for opts from its pool and makes it the
// caller's; nil, nil when there is no pool for opts or none is ready.
func (r *Runtime) claimPooled(ctx context.Context, opts BoxOptions) (*Box, error) {
	key, _, ok := poolKey(opts)
	if !ok || !r.pool.Has(key) {
		return nil, nil
	}
	if opts.Name != "" {
		// Refused before a pool box is spent on it (a rename that loses
		// a race still is, below).
		if inUse, err := r.db.NameInUse(ctx, opts.Name); err != nil {
			return nil, err
		} else if inUse {
			return nil, fmt.Errorf("%w: %q (remove it, or pick another name)", ErrNameInUse, opts.Name)
		}
	}
	b, _, err := r.pool.Claim(ctx, key, func(ctx context.Context, b *Box, restored bool) (bool, error) {
		err := r.personalise(ctx, b, restored, opts)
		// A pool box that died or broke while it waited: the next is
		// tried.
		return !errors.Is(err, ErrNameInUse), err
	})
	if err == nil && b != nil {
		// The caller's box from now: its life's first events.
		b.emit(Event{Type: EventBoxCreated})
		b.emit(Event{Type: EventBoxStarted})
	}
	return b, err
}

// personalise makes pool box b the caller's box of opts: its name,
// hostname and AutoRemove, no pool mark; then the guest takes its
// hostname and, when restored from the template, fresh entropy and the
// host's time (as a restore does: it may have waited long in the pool).
func (r *Runtime) personalise(ctx context.Context, b *Box, restored bool, opts BoxOptions) error {
	_, cfg := b.snapshot()
	o, m := boxopts.Claim(cfg.Options.plain(), cfg.Meta, opts.plain(), time.Now(), bootTimeout)
	c := boxConfig{Options: public(o), Meta: m}
	if opts.Name != "" {
		if err := b.Rename(ctx, opts.Name); err != nil {
			return err
		}
	}
	// A pool box is nobody's until now: its record is c, whole.
	if err := r.updateConfig(ctx, b.id, func(s *boxConfig) { *s = c }); err != nil {
		return fmt.Errorf("box %s: record it: %w", b.id, err)
	}
	if _, err := b.load(ctx); err != nil {
		return err
	}
	if !opts.AutoRemove {
		// The caller's box outlives this process; an AutoRemove one
		// stays watched and ends with it, as its own would.
		if rec, _ := b.snapshot(); rec.PID > 0 {
			r.keeper.Release(rec.PID, rec.PIDStart)
		}
	}
	if restored {
		return b.restored(ctx)
	}
	// A booted box has its own entropy and the right time; only its
	// hostname may change.
	if opts.Name == "" && opts.Hostname == "" {
		return nil
	}
	cl, err := b.client(ctx)
	if err != nil {
		return err
	}
	rec, cfg := b.snapshot()
	if _, err := cl.Restored(ctx, nil, 0, hostname(rec, cfg)); err != nil {
		return fmt.Errorf("box %s: set its hostname: %w", b.id, b.callErr(err))
	}
	return nil
}

// FromPool reports whether Create took this box from a warm pool of this
// runtime (Options.Pool) rather than booting or restoring it.
func (b *Box) FromPool() bool { return b.r.pool.FromPool(b.id) }

// Pools returns the state of the runtime's warm pools (Options.Pool), in
// the order they were given.
func (r *Runtime) Pools() []PoolInfo {
	st := r.pool.Status()
	if st == nil {
		return nil
	}
	out := make([]PoolInfo, 0, len(st))
	for _, p := range st {
		out = append(out, PoolInfo{Image: p.Name, Key: p.Key, Size: p.Size, Ready: p.Ready, Filling: p.Filling,
			Template: p.Template, Booted: p.Booted, Claimed: p.Claimed, LastError: p.LastError,
			HeldBack: p.HeldBack, Evicted: p.Evicted, Boxes: p.Boxes})
	}
	return out
}

// WaitPools waits until every warm pool is full, or held back by a cap
// with no fill in progress (PoolInfo.HeldBack says which), or ctx ends
// (its error).
func (r *Runtime) WaitPools(ctx context.Context) error {
	if err := r.pool.Wait(ctx); err != nil {
		return fmt.Errorf("wait for the warm pools: %w", err)
	}
	return nil
}

// PoolBox is a warm-pool box of the home (Runtime.PoolBoxes): made by a
// pool of some process (this one, an `airlock serve`), not yet claimed.
// List and Get do not show such boxes.
type PoolBox struct {
	ID string
	// Pool is the key of the pool holding it (PoolInfo.Key).
	Pool  string
	Image string
	State BoxState
	// PID is its machine's process while it runs.
	PID int
	// OwnerPID is the process whose pool holds it; the box goes when that
	// process closes its runtime (or, if it dies, with the next Open of
	// the home).
	OwnerPID int
	Created  time.Time
	// Dir is its box directory (writable layer, console log).
	Dir string
}

// PoolBoxes lists the warm-pool boxes of this home, of the pools of every
// process (Runtime.Pools has this process's pools), oldest first.
func (r *Runtime) PoolBoxes(ctx context.Context) ([]PoolBox, error) {
	recs, err := r.db.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list boxes: %w", err)
	}
	var out []PoolBox
	for _, rec := range recs {
		cfg, err := decodeConfig(rec)
		if err != nil || cfg.Pool == "" {
			continue
		}
		out = append(out, PoolBox{ID: rec.ID, Pool: cfg.Pool, Image: rec.Image, State: BoxState(rec.State), PID: rec.PID,
			OwnerPID: cfg.OwnerPID, Created: rec.Created, Dir: filepath.Join(r.opts.Home, "boxes", rec.ID)})
	}
	return out, nil
}

// poolBoxIDs returns the ids among ids of warm-pool boxes.
func (r *Runtime) poolBoxIDs(ctx context.Context, ids []string) []string {
	pbs, _ := r.PoolBoxes(ctx)
	var out []string
	for _, pb := range pbs {
		if slices.Contains(ids, pb.ID) {
			out = append(out, pb.ID)
		}
	}
	return out
}
