package airlock

import (
	"context"
	"fmt"
	"sync"

	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
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

// reserve counts a fill of p in, if the caps leave room for one more box
// of p; otherwise it records why not in p.heldBack and returns false.
func (p *pool) reserve(ctx context.Context) bool {
	s := p.s
	s.roomMu.Lock()
	defer s.roomMu.Unlock()
	why := s.noRoom(ctx, p.opts.MemoryMiB)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.heldBack = why
	if why != "" {
		return false
	}
	p.filling++
	return true
}

// checkRoom records in p.heldBack why p, short of its size with no fill
// in progress, cannot fill now ("" when it can), without reserving.
func (p *pool) checkRoom(ctx context.Context) {
	s := p.s
	s.roomMu.Lock()
	defer s.roomMu.Unlock()
	p.mu.Lock()
	short := len(p.ready) < p.opts.Size && p.filling == 0
	p.mu.Unlock()
	if !short {
		return
	}
	why := s.noRoom(ctx, p.opts.MemoryMiB)
	p.mu.Lock()
	p.heldBack = why
	p.mu.Unlock()
}

// noRoom says why one more pool box of memMiB does not fit the caps now
// ("" when it does). Preconditions: s.roomMu held.
func (s *poolSet) noRoom(ctx context.Context, memMiB int) string {
	r := s.r
	maxBoxes, maxMem := r.capacityLimits()
	all, filling, fillingMiB := s.held()
	s.mu.Lock()
	starting, startingMiB := s.launching, s.launchingMiB
	s.mu.Unlock()
	if ur, ok := r.drv.(vmm.UsageReporter); ok {
		// Fills and starts whose machine runs already are counted twice
		// (by the driver, and as in progress): the fills leave room
		// rather than take it.
		u := ur.Usage("")
		if n := u.Machines + filling + starting; n+1 > maxBoxes {
			return fmt.Sprintf("at the host cap of %d running boxes (Options.MaxBoxes, or AIRLOCK_MAX_BOXES=N): %d run, %d more are being made or started",
				maxBoxes, u.Machines, filling+starting)
		}
		pending := fillingMiB + startingMiB + (filling+starting)*boxOverheadMiB
		if m := usageMiB(u) + pending; m+hostMiB(memMiB) > maxMem {
			return fmt.Sprintf("at the host memory cap of %d MiB (Options.MaxMemoryMiB, or AIRLOCK_MAX_MEMORY=MiB): running boxes take %d MiB, %d MiB are being made or started, a pool box takes %d MiB (its memory and %d MiB for QEMU and its helpers)",
				maxMem, usageMiB(u), pending, hostMiB(memMiB), boxOverheadMiB)
		}
	} else if hostMiB(memMiB) > maxMem {
		return fmt.Sprintf("a pool box's %d MiB of memory (and %d MiB for QEMU and its helpers) is more than the host memory cap of %d MiB (Options.MaxMemoryMiB)", memMiB, boxOverheadMiB, maxMem)
	}
	if s.homeLimit > 0 {
		users, err := s.homeBoxes(ctx, "")
		if err != nil {
			return fmt.Sprintf("cannot count the home's boxes: %v", err)
		}
		if users+all+1 > s.homeLimit {
			return fmt.Sprintf("at the home's limit of %d boxes not stopped (airlock serve --max-boxes, or Options.PoolMaxHomeBoxes): %d boxes and %d pool boxes",
				s.homeLimit, users, all)
		}
	}
	return ""
}

// held counts the boxes the pools hold: all of them (ready, being
// filled, being claimed), and those being filled (which may not run yet)
// with their memory.
func (s *poolSet) held() (all, filling, fillingMiB int) {
	for _, p := range s.order {
		p.mu.Lock()
		all += len(p.ready) + p.filling + p.claiming
		filling += p.filling
		fillingMiB += p.filling * p.opts.MemoryMiB
		p.mu.Unlock()
	}
	return all, filling, fillingMiB
}

// homeBoxes counts the boxes of the home that are not stopped and not
// pool boxes (what List shows), other than box except.
func (s *poolSet) homeBoxes(ctx context.Context, except string) (int, error) {
	recs, err := s.r.db.List(ctx)
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
	s := r.pool
	if s == nil {
		return func() {}, r.checkCapacity(id, memMiB)
	}
	s.roomMu.Lock()
	defer s.roomMu.Unlock()
	for user && s.overCap(ctx, id, memMiB) && s.evictOne(ctx) {
	}
	s.mu.Lock()
	n, mib := s.launching, s.launchingMiB
	s.mu.Unlock()
	if err := r.checkCapacityWith(id, memMiB, n, mib); err != nil {
		return func() {}, err
	}
	s.mu.Lock()
	s.launching++
	s.launchingMiB += memMiB
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.launching--
			s.launchingMiB -= memMiB
			s.mu.Unlock()
		})
	}, nil
}

// overCap reports whether starting box id of memMiB passes a host cap
// that removing pool boxes could help with (counting the launches in
// progress), or the home's budget. Preconditions: s.roomMu held.
func (s *poolSet) overCap(ctx context.Context, id string, memMiB int) bool {
	maxBoxes, maxMem := s.r.capacityLimits()
	if ur, ok := s.r.drv.(vmm.UsageReporter); ok && hostMiB(memMiB) <= maxMem {
		u := ur.Usage(id)
		s.mu.Lock()
		n, mib := s.launching, s.launchingMiB
		s.mu.Unlock()
		if u.Machines+n+1 > maxBoxes || usageMiB(u)+mib+n*boxOverheadMiB+hostMiB(memMiB) > maxMem {
			return true
		}
	}
	if s.homeLimit <= 0 {
		return false
	}
	users, err := s.homeBoxes(ctx, id)
	if err != nil {
		return false
	}
	all, _, _ := s.held()
	return users+1+all > s.homeLimit
}

// evictOne removes the newest ready box of the pool with the most ready
// ones; false when no pool has one.
func (s *poolSet) evictOne(ctx context.Context) bool {
	var from *pool
	most := 0
	for _, p := range s.order {
		p.mu.Lock()
		if n := len(p.ready); n > most {
			from, most = p, n
		}
		p.mu.Unlock()
	}
	if from == nil {
		return false
	}
	from.mu.Lock()
	n := len(from.ready)
	if n == 0 {
		from.mu.Unlock()
		return true // claimed meanwhile: look again
	}
	pb := from.ready[n-1]
	from.ready = from.ready[:n-1]
	from.evicted++
	from.mu.Unlock()
	if err := pb.b.remove(context.WithoutCancel(ctx), true); err != nil {
		s.r.warn(fmt.Sprintf("pool %s: remove box %s to make room: %v", from.opts.Image, pb.b.id, err))
	}
	return true
}
