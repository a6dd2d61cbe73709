package airlock

import (
	"context"
	"errors"

	"github.com/airlock-run/airlock/internal/pool"
	"github.com/airlock-run/airlock/internal/store"
)

// Warm pools and the caps (docs/pool.md, "Caps"): a pool box is a running
// machine, counted against the host caps and the home's budget for pools
// (Options.PoolMaxHomeBoxes). The rules are pool.Caps's; the scheduler
// (internal/pool) counts and evicts; the runtime counts machines and
// boxes for it (caps).

// caps are the host caps as the pool scheduler and a start ask them
// (pool.Caps: a pool.Room): Options.MaxBoxes and Options.MaxMemoryMiB over
// the driver's machines, and homeLimit boxes of the home (0: none).
func (r *Runtime) caps(homeLimit int) *pool.Caps {
	return &pool.Caps{Limits: r.capacityLimits, Usage: r.machineUsage, HomeLimit: homeLimit, HomeBoxes: r.homeBoxes,
		Refuse: capacityError, Refused: func(err error) bool {
			var ce *CapacityError
			return errors.As(err, &ce)
		}}
}

// homeBoxes counts the boxes of the home that are not stopped and not
// pool boxes (what List shows), other than box except.
func (r *Runtime) homeBoxes(ctx context.Context, except string) (int, error) {
	recs, err := r.db.List(ctx)
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
