package airlock

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/lifecycle"
	"github.com/airlock-run/airlock/internal/lifetime"
	"github.com/airlock-run/airlock/internal/store"
)

// DefaultReapInterval is how often an open Runtime looks for boxes past
// their TTL, idle timeout or lease (Options.ReapInterval).
const DefaultReapInterval = time.Second

// usePersistEvery is how often at most a box's use is written to its
// record (for other processes' reapers): use more frequent than that is
// kept in the handle, which this process's reaper reads.
const usePersistEvery = 2 * time.Second

// ReapReason is why the runtime removed a box (BoxReapedEvent.Reason).
type ReapReason string

// Reasons a box is reaped.
const (
	// ReapTTL: its BoxOptions.TTL ended.
	ReapTTL ReapReason = lifetime.ReasonTTL
	// ReapIdle: nothing used it for BoxOptions.IdleTimeout.
	ReapIdle ReapReason = lifetime.ReasonIdle
	// ReapLease: its BoxOptions.Lease was not renewed in time.
	ReapLease ReapReason = lifetime.ReasonLease
)

// IdleAction is what BoxOptions.IdleTimeout does to a box nothing used
// for that long.
type IdleAction string

// Idle actions (BoxOptions.IdleAction).
const (
	// IdleRemove removes the idle box, running or not (the default; ""
	// is the same).
	IdleRemove IdleAction = "remove"
	// IdleStop stops the idle box (Box.Stop); it stays, stopped, until
	// started again. A stopped box is left as it is.
	IdleStop IdleAction = "stop"
	// IdleSuspend pauses the idle running box to disk (Box.Suspend): it
	// holds no host memory or CPU, shows as suspended, and resumes by
	// itself, with its processes and memory, on the next call that needs
	// it (exec, files, code, ports) and, while a Runtime is open on the
	// home, on the first inbound connection to a published TCP port
	// (the port stays bound; the connection waits for the resume and is
	// then served). Boxes with volumes cannot be suspended
	// (ErrInvalidArgument).
	IdleSuspend IdleAction = "suspend"
)

// ErrNoLease is returned by Box.RenewLease for a box created without
// BoxOptions.Lease.
var ErrNoLease = errors.New("box has no lease")

// BoxReapedEvent describes a box the runtime removed because its lifetime
// ended (see Runtime.OnReap).
type BoxReapedEvent struct {
	BoxID  string
	Reason ReapReason
	// Err is Remove's error (nil: the box is gone).
	Err error
}

// lifeState is the runtime's reaper.
type lifeState struct {
	mu     sync.Mutex // serialises Reap passes
	hookMu sync.Mutex
	hook   func(BoxReapedEvent)
	loop   *lifetime.Loop
	// traffic is, by box, its network counters when a pass last found it
	// idle (guarded by mu): traffic since counts as use (idleAct).
	traffic lifecycle.Traffic
	// wakes is the resumes in progress of boxes suspended when idle
	// (suspend.go).
	wakes lifecycle.Wakes
	// held is the published ports of IdleSuspend boxes this runtime holds
	// open (suspend.go).
	held lifecycle.Ports
}

// life returns c's lifetime options and deadlines (internal/lifetime).
func (c *boxConfig) life() (lifetime.Limits, lifetime.Deadlines) {
	o := c.Options
	return lifetime.Limits{TTL: o.TTL, Idle: o.IdleTimeout, Lease: o.Lease},
		lifetime.Deadlines{ExpiresAt: c.ExpiresAt, LeaseUntil: c.LeaseUntil, LastUse: c.LastUse}
}

// OnReap sets f to be called for each box the runtime removes because its
// TTL, idle timeout or lease ended (nil: none). f is called from the
// reaper's goroutine, after the removal; it must not block for long. The
// removals Open makes happen before f can be set.
func (r *Runtime) OnReap(f func(BoxReapedEvent)) {
	r.life.hookMu.Lock()
	r.life.hook = f
	r.life.hookMu.Unlock()
}

// startReaper starts the loop that runs Reap every ReapInterval, until
// stopReaper.
func (r *Runtime) startReaper() {
	iv := r.opts.ReapInterval
	if iv <= 0 {
		iv = DefaultReapInterval
	}
	r.life.loop = lifetime.Every(iv, func(ctx context.Context) { r.Reap(ctx) })
}

// stopReaper stops the reaper and waits for its pass in progress.
func (r *Runtime) stopReaper() {
	r.life.loop.Stop()
	// The ports held for suspended boxes are closed with the runtime: a
	// box it suspended then wakes by a call only.
	r.releaseStale(nil)
}

// Reap removes the boxes of the home whose TTL, idle timeout or lease has
// ended, and returns what it removed (or failed to); an idle box whose
// IdleAction is IdleStop or IdleSuspend is stopped or suspended instead
// (not returned: box.stopped and box.suspended events report it). The reaper calls it
// every Options.ReapInterval; Open calls it once. Boxes in use through a
// handle of this runtime count as used now, and their use is recorded so
// that other processes' reapers see it.
func (r *Runtime) Reap(ctx context.Context) []BoxReapedEvent {
	r.life.mu.Lock()
	defer r.life.mu.Unlock()
	recs, err := r.db.List(ctx)
	if err != nil {
		return nil
	}
	now := time.Now()
	var out []BoxReapedEvent
	live := map[string]bool{}
	for _, rec := range recs {
		if running(rec) || boxdir.SuspendedIn(filepath.Join(r.opts.Home, "boxes", rec.ID)) != "" {
			live[rec.ID] = true
		}
	}
	r.releaseStale(live)
	for _, rec := range recs {
		cfg, err := decodeConfig(rec)
		lim, dl := cfg.life()
		if err != nil || cfg.Pool != "" || !lim.Any() {
			continue
		}
		r.mu.Lock()
		h := r.boxes[rec.ID]
		r.mu.Unlock()
		var use *lifetime.Use // this process's use of the box, if it holds it
		if h != nil {
			use = &h.use
		}
		why := ReapReason(lifetime.Due(lim, dl, use, now, func() { h.touch(ctx) }))
		if why == "" {
			continue
		}
		if act := cfg.Options.IdleAction; why == ReapIdle && (act == IdleStop || act == IdleSuspend) {
			r.idleAct(ctx, rec, act)
			continue
		}
		err = r.removeWhy(ctx, rec.ID, true, string(why))
		if errors.Is(err, ErrBoxNotFound) {
			continue // another process's reaper, or its owner, was first
		}
		ev := BoxReapedEvent{BoxID: rec.ID, Reason: why, Err: err}
		out = append(out, ev)
		r.life.hookMu.Lock()
		f := r.life.hook
		r.life.hookMu.Unlock()
		if f != nil {
			f(ev)
		}
	}
	return out
}

// idleAct stops or suspends (act) the idle box of rec, unless it is not
// running (stopped, suspended) or its network carried traffic since the
// last pass that found it idle (that is use: its idle clock restarts).
// A failure is reported as a warning, and the box is left for another
// idle timeout.
func (r *Runtime) idleAct(ctx context.Context, rec *store.Box, act IdleAction) {
	if !running(rec) {
		r.life.traffic.Forget(rec.ID)
		return
	}
	b, err := r.Get(ctx, rec.ID)
	if err != nil {
		return
	}
	if r.life.traffic.Used(ctx, b.netBox()) {
		b.idleClockRestart(ctx)
		return
	}
	if act == IdleSuspend {
		err = b.Suspend(ctx)
	} else {
		err = b.Stop(ctx)
	}
	r.life.traffic.Forget(rec.ID)
	if err != nil && !errors.Is(err, ErrBoxNotFound) && ctx.Err() == nil {
		r.warn(fmt.Sprintf("box %s: idle timeout: %s it: %v (tried again after another idle timeout)", rec.ID, act, err))
		b.idleClockRestart(ctx)
	}
}

// idleClockRestart restarts the idle clock of a box with an idle timeout
// (a start or resume is a use).
func (b *Box) idleClockRestart(ctx context.Context) {
	_, cfg := b.snapshot()
	if cfg.Options.IdleTimeout <= 0 {
		return
	}
	now := time.Now()
	b.use.Mark(now)
	_ = b.r.updateConfig(context.WithoutCancel(ctx), b.id, func(c *boxConfig) { c.LastUse = now })
}

// Use marks the box in use (for BoxOptions.IdleTimeout) until the func
// it returns is called: for work done through a Background exec, which
// does not count by itself (a CodeBox cell).
func (b *Box) Use(ctx context.Context) (done func()) { return b.useBegin(ctx) }

// useBegin marks an exec starting on the box; the func it returns marks
// its end. An exec in flight keeps the box from going idle.
func (b *Box) useBegin(ctx context.Context) func() {
	b.use.Begin()
	b.touch(ctx)
	return func() {
		b.use.End()
		b.touch(context.Background())
	}
}

// touch records a use of the box (for IdleTimeout): in the handle at once,
// in the record at most every usePersistEvery.
func (b *Box) touch(ctx context.Context) {
	_, cfg := b.snapshot()
	if cfg.Options.IdleTimeout <= 0 {
		return
	}
	t := time.Now()
	if !b.use.Touch(t, usePersistEvery) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// Best effort: the handle keeps the use for this process's reaper.
	_ = b.r.updateConfig(ctx, b.id, func(c *boxConfig) {
		if t.After(c.LastUse) {
			c.LastUse = t
		}
	})
}

// lifeBegins restarts the lease and the idle clock of a box just handed
// to its caller (its boot or restore may have taken longer than either).
func (b *Box) lifeBegins(ctx context.Context) {
	_, cfg := b.snapshot()
	if cfg.Options.Lease <= 0 && cfg.Options.IdleTimeout <= 0 {
		return
	}
	now := time.Now()
	if cfg.Options.IdleTimeout > 0 {
		b.use.Mark(now)
	}
	_ = b.r.updateConfig(context.WithoutCancel(ctx), b.id, func(c *boxConfig) {
		l, d := c.life()
		lifetime.Handover(l, &d, now)
		c.LeaseUntil, c.LastUse = d.LeaseUntil, d.LastUse
	})
}

// RenewLease extends the box's lease (BoxOptions.Lease) to Lease from now.
// Errors: ErrNoLease for a box without a lease; ErrBoxNotFound once it is
// gone.
func (b *Box) RenewLease(ctx context.Context) error {
	var noLease bool
	err := b.r.updateConfig(ctx, b.id, func(c *boxConfig) {
		if c.Options.Lease <= 0 {
			noLease = true
			return
		}
		c.LeaseUntil = time.Now().Add(c.Options.Lease)
	})
	if err != nil {
		return err
	}
	if noLease {
		return fmt.Errorf("%w: box %s (create it with BoxOptions.Lease)", ErrNoLease, b.id)
	}
	_, err = b.load(ctx)
	return err
}

// SetTTL gives the box a new TTL counted from now: it is removed once ttl
// has passed (BoxInfo.ExpiresAt shows when), whatever TTL it had;
// BoxOptions.TTL becomes ttl. ttl must be positive (ErrInvalidArgument);
// ErrBoxNotFound once the box is gone.
func (b *Box) SetTTL(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: ttl %s: want more than 0", ErrInvalidArgument, ttl)
	}
	at := time.Now().Add(ttl)
	if err := b.r.updateConfig(ctx, b.id, func(c *boxConfig) {
		c.Options.TTL, c.ExpiresAt = ttl, at
	}); err != nil {
		return err
	}
	_, err := b.load(ctx)
	return err
}

// SetIdleTimeout gives the box a new idle timeout counted from now: its
// IdleAction (BoxOptions.IdleAction) acts once d passes with no use
// (BoxInfo.IdleDeadline shows when), whatever idle timeout it had;
// BoxOptions.IdleTimeout becomes d. d must be positive
// (ErrInvalidArgument); ErrBoxNotFound once the box is gone.
func (b *Box) SetIdleTimeout(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: idle timeout %s: want more than 0", ErrInvalidArgument, d)
	}
	now := time.Now()
	b.use.Mark(now)
	if err := b.r.updateConfig(ctx, b.id, func(c *boxConfig) {
		c.Options.IdleTimeout, c.LastUse = d, now
	}); err != nil {
		return err
	}
	_, err := b.load(ctx)
	return err
}

// cfgMu serialises this process's read-modify-writes of box records.
var cfgMu sync.Mutex

// updateConfig rewrites box id's stored configuration with f applied
// (nothing when f leaves it unchanged).
func (r *Runtime) updateConfig(ctx context.Context, id string, f func(*boxConfig)) error {
	cfgMu.Lock()
	defer cfgMu.Unlock()
	rec, err := r.db.Get(ctx, id)
	if err != nil {
		return r.storeErr(id, err)
	}
	c, err := decodeConfig(rec)
	if err != nil {
		return err
	}
	before := string(encodeConfig(c))
	f(&c)
	raw := encodeConfig(c)
	if string(raw) == before {
		return nil
	}
	if err := r.db.SetConfig(ctx, id, raw); err != nil {
		return fmt.Errorf("box %s: record it: %w", id, err)
	}
	return nil
}
