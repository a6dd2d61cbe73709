package airlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlock-run/airlock/internal/capacity"
	"github.com/airlock-run/airlock/internal/pool"
	"github.com/airlock-run/airlock/internal/store"
)

// Warm pools and the caps (docs/pool.md, "Caps"). A pool box is a running
// machine: it counts against the host caps (Options.MaxBoxes and
// Options.MaxMemoryMiB, which count the driver's machines host-wide) and
// against the home's budget for pools (Options.PoolMaxHomeBoxes, which
// `airlock serve --max-boxes` sets). The rules:
//
//   - a fill is made only when there is room for it: the running machines,
//     the fills and the starts of this runtime in progress, plus one, fit
//     the caps; otherwise the pool is held back (PoolInfo.HeldBack) until
//     the next check (every second, and after each claim);
//   - a claim turns a pool box into the caller's box: counted once, before
//     and after;
//   - a box of this runtime that is not a pool box and would start past a
//     cap first takes the room of ready pool boxes: they are removed
//     (PoolInfo.Evicted), one at a time, from the pool with the most ready,
//     newest first, until it fits or none is left. Boxes being filled are
//     not stopped: a start past a cap with no ready pool box fails as it
//     would without pools (CapacityError);
//   - every start of this runtime (a user box's, a pool box's) checks the
//     host caps and holds its place until its machine runs
//     (reserveLaunch): concurrent starts of one runtime cannot pass a cap
//     together. Other processes' starts are checked, not reserved.
//
// The scheduler (internal/pool) counts and evicts; poolRoom, below, is
// the caps it asks.

// poolRoom is the caps as the pool scheduler asks them (pool.Room): the
// host caps, counted by the driver, and the home's budget for pools.
type poolRoom struct {
	r *Runtime
	// homeLimit is Options.PoolMaxHomeBoxes (0: none).
	homeLimit int
}

// Fill says why one more pool box of memMiB does not fit the caps now
// ("" when it does).
func (m *poolRoom) Fill(ctx context.Context, memMiB int, c pool.Counts) string {
	p := capacity.Pending{Filling: c.Filling, FillingMiB: c.FillingMiB, Starting: c.Starting, StartingMiB: c.StartingMiB}
	if why := m.r.capacityLimits().Fill(m.r.machineUsage(""), p, memMiB); why != "" {
		return why
	}
	if m.homeLimit > 0 {
		users, err := m.homeBoxes(ctx, "")
		if err != nil {
			return fmt.Sprintf("cannot count the home's boxes: %v", err)
		}
		return capacity.HomeFill(m.homeLimit, users, c.Held)
	}
	return ""
}

// Evict reports whether starting box id of memMiB passes a host cap that
// removing pool boxes could help with (counting the launches in
// progress), or the home's budget.
func (m *poolRoom) Evict(ctx context.Context, id string, memMiB int, c pool.Counts) bool {
	if m.r.capacityLimits().Evict(m.r.machineUsage(id), c.Starting, c.StartingMiB, memMiB) {
		return true
	}
	if m.homeLimit <= 0 {
		return false
	}
	users, err := m.homeBoxes(ctx, id)
	if err != nil {
		return false
	}
	return capacity.HomeFull(m.homeLimit, users, c.Held)
}

// Start checks the host caps for box id of memMiB with the launches in
// progress (a CapacityError).
func (m *poolRoom) Start(id string, memMiB int, c pool.Counts) error {
	return m.r.checkCapacityWith(id, memMiB, c.Starting, c.StartingMiB)
}

// Full reports whether err is a start refused at a host cap.
func (m *poolRoom) Full(err error) bool {
	var ce *CapacityError
	return errors.As(err, &ce)
}

// homeBoxes counts the boxes of the home that are not stopped and not
// pool boxes (what List shows), other than box except.
func (m *poolRoom) homeBoxes(ctx context.Context, except string) (int, error) {
	recs, err := m.r.db.List(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, rec := range recs {
		if rec.ID == except || rec.State == store.StateStopped {
			continue
		}
		if cfg, err := decodeConfig(rec); err == nil && cfg.Pool != "" {
			continue
		}
		n++
	}
	return n, nil
}

// reserveLaunch checks the host caps before box id of memMiB starts (as
// checkCapacity does) and, with warm pools, holds its place until
// launched is called (once its machine runs, or it failed): other starts
// and fills of this runtime count it meanwhile, so that concurrent starts
// cannot pass a cap together. A user box (not a pool box) that would pass
// a host cap or the home's budget first removes ready pool boxes.
func (r *Runtime) reserveLaunch(ctx context.Context, id string, memMiB int, user bool) (launched func(), err error) {
	if r.pool == nil {
		return func() {}, r.checkCapacity(id, memMiB)
	}
	return r.pool.Launch(ctx, id, memMiB, user)
}
