package airlock

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

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
	pbs, err := r.PoolBoxes(ctx)
	if err != nil {
		return nil
	}
	in := map[string]bool{}
	for _, id := range ids {
		in[id] = true
	}
	var out []string
	for _, pb := range pbs {
		if in[pb.ID] {
			out = append(out, pb.ID)
		}
	}
	return out
}
