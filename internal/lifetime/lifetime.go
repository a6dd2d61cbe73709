// Package lifetime is the arithmetic of box lifetimes, apart from boxes:
// the deadlines a box's TTL, idle timeout and lease give it (stored with
// the box), whether one has passed, a handle's record of use (throttled,
// so that a busy box does not rewrite its record at every call), and the
// loop that runs the reaper's passes. What a box is, and how it is
// removed, is the root package's (lifetime.go).
package lifetime

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Limits are a box's lifetime options (BoxOptions.TTL, IdleTimeout and
// Lease); 0 is none.
type Limits struct {
	TTL, Idle, Lease time.Duration
}

// Any reports whether l limits the box's life at all.
func (l Limits) Any() bool { return l.TTL > 0 || l.Idle > 0 || l.Lease > 0 }

// Check refuses negative limits.
func (l Limits) Check() error {
	if l.TTL < 0 || l.Idle < 0 || l.Lease < 0 {
		return fmt.Errorf("ttl %s, idle timeout %s, lease %s: want 0 (none) or more", l.TTL, l.Idle, l.Lease)
	}
	return nil
}

// Deadlines are what a box stores of its lifetime: when its TTL ends,
// when its lease runs out, and its last use recorded (for the idle
// timeout). Zero when the box has no such limit.
type Deadlines struct {
	ExpiresAt, LeaseUntil, LastUse time.Time
}

// Start returns the deadlines of a box of l whose record is made at now,
// before its boot. The TTL counts from now; the lease and the idle clock
// count from when the box is handed over (its caller renews them), so
// until then they leave the boot grace (a reaper must not take a box
// that is still booting; one whose creator died while it booted goes
// once that grace ends).
func Start(l Limits, now time.Time, grace time.Duration) Deadlines {
	var d Deadlines
	if l.TTL > 0 {
		d.ExpiresAt = now.Add(l.TTL)
	}
	if l.Lease > 0 {
		g := l.Lease
		if g < math.MaxInt64-grace {
			g += grace
		}
		d.LeaseUntil = now.Add(g)
	}
	if l.Idle > 0 {
		d.LastUse = now.Add(grace)
	}
	return d
}

// Handover restarts, in d, the lease and the idle clock of a box of l
// handed to its caller at now (its boot may have taken longer than
// either).
func Handover(l Limits, d *Deadlines, now time.Time) {
	if l.Lease > 0 {
		d.LeaseUntil = now.Add(l.Lease)
	}
	if l.Idle > 0 {
		d.LastUse = now
	}
}

// IdleDeadline is when a box with idle timeout idle, last used at
// lastUse, goes unless used (zero: no idle timeout).
func IdleDeadline(idle time.Duration, lastUse time.Time) time.Time {
	if idle <= 0 {
		return time.Time{}
	}
	return lastUse.Add(idle)
}

// Why a box's life ended (Reason); the public ReapReason's values.
const (
	ReasonTTL   = "ttl"
	ReasonIdle  = "idle_timeout"
	ReasonLease = "lease_expired"
)

// Reason returns why a box of l and d, last used at lastUse, goes at
// now: ReasonTTL, ReasonIdle or ReasonLease, in that order; "" to keep
// it.
func Reason(l Limits, d Deadlines, now, lastUse time.Time) string {
	switch {
	case !d.ExpiresAt.IsZero() && now.After(d.ExpiresAt):
		return ReasonTTL
	case l.Idle > 0 && now.Sub(lastUse) > l.Idle:
		return ReasonIdle
	case l.Lease > 0 && now.After(d.LeaseUntil):
		return ReasonLease
	}
	return ""
}

// Due returns why a box of l and d goes at now ("" to keep it): Reason,
// its last use the later of d.LastUse and u's (a handle's; nil: none).
// A call in flight through u counts as a use now: touch is called first
// to record it.
func Due(l Limits, d Deadlines, u *Use, now time.Time, touch func()) string {
	last := d.LastUse
	if u != nil && l.Idle > 0 {
		if u.Busy() {
			touch()
		}
		if t := u.Last(); t.After(last) {
			last = t
		}
	}
	return Reason(l, d, now, last)
}

// Use is one handle's use of its box. The zero value is ready.
type Use struct {
	busy      atomic.Int32 // calls in flight
	last      atomic.Int64 // last use, unix ns (0: none through this handle)
	persisted atomic.Int64 // last use written to the record, unix ns
}

// Begin marks a call starting; End its end. A call in flight keeps the
// box in use (Busy).
func (u *Use) Begin() { u.busy.Add(1) }

// End marks the end of a call Begin marked.
func (u *Use) End() { u.busy.Add(-1) }

// Busy reports whether a call is in flight.
func (u *Use) Busy() bool { return u.busy.Load() > 0 }

// Mark records a use at now, in the handle only.
func (u *Use) Mark(now time.Time) { u.last.Store(now.UnixNano()) }

// Last is the last use recorded (zero: none through this handle).
func (u *Use) Last() time.Time {
	if t := u.last.Load(); t != 0 {
		return time.Unix(0, t)
	}
	return time.Time{}
}

// Touch records a use at now and reports whether it is to be written to
// the box's record too: at most once every every (one caller of
// concurrent ones).
func (u *Use) Touch(now time.Time, every time.Duration) (persist bool) {
	n := now.UnixNano()
	u.last.Store(n)
	p := u.persisted.Load()
	return time.Duration(n-p) >= every && u.persisted.CompareAndSwap(p, n)
}

// Loop runs a pass every interval until Stop.
type Loop struct {
	stop, done chan struct{}
}

// Every starts a loop calling pass every interval (a pass in progress
// when Stop is called gets a cancelled context).
func Every(interval time.Duration, pass func(ctx context.Context)) *Loop {
	l := &Loop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-l.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			pass(ctx)
			cancel()
		}
	}()
	return l
}

// Stop ends the loop and waits for its pass in progress; a nil Loop is
// stopped already.
func (l *Loop) Stop() {
	if l == nil {
		return
	}
	close(l.stop)
	<-l.done
}
