package airlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
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
	ReapTTL ReapReason = "ttl"
	// ReapIdle: nothing used it for BoxOptions.IdleTimeout.
	ReapIdle ReapReason = "idle_timeout"
	// ReapLease: its BoxOptions.Lease was not renewed in time.
	ReapLease ReapReason = "lease_expired"
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
	stop   chan struct{}
	done   chan struct{}
}

// useState is one handle's use of its box.
type useState struct {
	busy      atomic.Int32 // execs in flight
	last      atomic.Int64 // last use, unix ns (0: none through this handle)
	persisted atomic.Int64 // last use written to the record, unix ns
}

// startLife sets the lifetime deadlines of a box whose record is made at
// now, before its boot. The TTL counts from now; the lease and the idle
// clock count from when Create hands the box over (lifeBegins), so until
// then they leave the boot bootTimeout (a reaper, of this process or
// another, must not take a box that is still booting; one whose creator
// died while it booted goes once that grace ends).
func (c *boxConfig) startLife(now time.Time) {
	o := c.Options
	c.ExpiresAt, c.LeaseUntil, c.LastUse = time.Time{}, time.Time{}, time.Time{}
	if o.TTL > 0 {
		c.ExpiresAt = now.Add(o.TTL)
	}
	if o.Lease > 0 {
		grace := o.Lease
		if grace < math.MaxInt64-bootTimeout {
			grace += bootTimeout
		}
		c.LeaseUntil = now.Add(grace)
	}
	if o.IdleTimeout > 0 {
		c.LastUse = now.Add(bootTimeout)
	}
}

// idleDeadline is when the box goes unless used (zero: no idle timeout).
func (c *boxConfig) idleDeadline() time.Time {
	if c.Options.IdleTimeout <= 0 {
		return time.Time{}
	}
	return c.LastUse.Add(c.Options.IdleTimeout)
}

// hasLife says whether the box has any lifetime limit.
func (c *boxConfig) hasLife() bool {
	return c.Options.TTL > 0 || c.Options.IdleTimeout > 0 || c.Options.Lease > 0
}

// reapReason returns why a box of c last used at lastUse goes at now, ""
// to keep it.
func (c *boxConfig) reapReason(now, lastUse time.Time) ReapReason {
	switch {
	case !c.ExpiresAt.IsZero() && now.After(c.ExpiresAt):
		return ReapTTL
	case c.Options.IdleTimeout > 0 && now.Sub(lastUse) > c.Options.IdleTimeout:
		return ReapIdle
	case c.Options.Lease > 0 && now.After(c.LeaseUntil):
		return ReapLease
	}
	return ""
}

// checkLife checks the lifetime options.
func checkLife(o BoxOptions) error {
	if o.TTL < 0 || o.IdleTimeout < 0 || o.Lease < 0 {
		return fmt.Errorf("%w: ttl %s, idle timeout %s, lease %s: want 0 (none) or more", ErrInvalidArgument, o.TTL, o.IdleTimeout, o.Lease)
	}
	return nil
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

// startReaper starts the goroutine that runs Reap every ReapInterval,
// until stopReaper.
func (r *Runtime) startReaper() {
	iv := r.opts.ReapInterval
	if iv <= 0 {
		iv = DefaultReapInterval
	}
	r.life.stop, r.life.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(r.life.done)
		t := time.NewTicker(iv)
		defer t.Stop()
		for {
			select {
			case <-r.life.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-r.life.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			r.Reap(ctx)
			cancel()
		}
	}()
}

// stopReaper stops the reaper and waits for its pass in progress.
func (r *Runtime) stopReaper() {
	if r.life.stop == nil {
		return
	}
	close(r.life.stop)
	<-r.life.done
}

// Reap removes the boxes of the home whose TTL, idle timeout or lease has
// ended, and returns what it removed (or failed to). The reaper calls it
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
	for _, rec := range recs {
		cfg, err := decodeConfig(rec)
		if err != nil || cfg.Pool != "" || !cfg.hasLife() {
			continue
		}
		last := cfg.LastUse
		r.mu.Lock()
		h := r.boxes[rec.ID]
		r.mu.Unlock()
		if h != nil && cfg.Options.IdleTimeout > 0 {
			if h.use.busy.Load() > 0 {
				h.touch(ctx)
			}
			if t := h.use.last.Load(); t > last.UnixNano() {
				last = time.Unix(0, t)
			}
		}
		why := cfg.reapReason(now, last)
		if why == "" {
			continue
		}
		err = r.Remove(ctx, rec.ID, true)
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

// useBegin marks an exec starting on the box; the func it returns marks
// its end. An exec in flight keeps the box from going idle.
func (b *Box) useBegin(ctx context.Context) func() {
	b.use.busy.Add(1)
	b.touch(ctx)
	return func() {
		b.use.busy.Add(-1)
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
	now := time.Now().UnixNano()
	b.use.last.Store(now)
	p := b.use.persisted.Load()
	if time.Duration(now-p) < usePersistEvery || !b.use.persisted.CompareAndSwap(p, now) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	t := time.Unix(0, now)
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
		b.use.last.Store(now.UnixNano())
	}
	_ = b.r.updateConfig(context.WithoutCancel(ctx), b.id, func(c *boxConfig) {
		if c.Options.Lease > 0 {
			c.LeaseUntil = now.Add(c.Options.Lease)
		}
		if c.Options.IdleTimeout > 0 {
			c.LastUse = now
		}
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
