package lifetime

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestStartDeadlinesLeaveTheBootItsGrace(t *testing.T) {
	now := time.Unix(1000, 0)
	grace := 2 * time.Minute
	l := Limits{TTL: time.Hour, Idle: time.Minute, Lease: 30 * time.Second}
	d := Start(l, now, grace)
	if !d.ExpiresAt.Equal(now.Add(time.Hour)) || !d.LeaseUntil.Equal(now.Add(30*time.Second+grace)) || !d.LastUse.Equal(now.Add(grace)) {
		t.Errorf("deadlines %+v: want the TTL from now, the lease and idle clock after the boot grace", d)
	}
	if d := Start(Limits{}, now, grace); d != (Deadlines{}) {
		t.Errorf("no limits: %+v, want none", d)
	}
	// The longest lease does not overflow into the past.
	if d := Start(Limits{Lease: math.MaxInt64}, now, grace); !d.LeaseUntil.After(now) {
		t.Errorf("longest lease ends at %v", d.LeaseUntil)
	}
	if !IdleDeadline(time.Minute, now).Equal(now.Add(time.Minute)) || !IdleDeadline(0, now).IsZero() {
		t.Error("IdleDeadline: want lastUse+idle, zero without an idle timeout")
	}
}

func TestReasonInOrder(t *testing.T) {
	now := time.Unix(1000, 0)
	l := Limits{TTL: time.Hour, Idle: time.Minute, Lease: time.Minute}
	d := Deadlines{ExpiresAt: now.Add(time.Hour), LeaseUntil: now.Add(time.Minute), LastUse: now}
	for _, c := range []struct {
		at, used time.Time
		want     string
	}{
		{now.Add(30 * time.Second), now, ""},
		{now.Add(2 * time.Minute), now.Add(90 * time.Second), ReasonLease},
		{now.Add(2 * time.Minute), now, ReasonIdle},
		{now.Add(2 * time.Hour), now, ReasonTTL},
	} {
		if got := Reason(l, d, c.at, c.used); got != c.want {
			t.Errorf("at %v used %v: %q, want %q", c.at.Sub(now), c.used.Sub(now), got, c.want)
		}
	}
	if got := Reason(Limits{}, Deadlines{}, now.Add(1000*time.Hour), time.Time{}); got != "" || (Limits{}).Any() {
		t.Errorf("no limits: reaped for %q", got)
	}
	if (Limits{TTL: -1}).Check() == nil || (Limits{Idle: time.Second}).Check() != nil {
		t.Error("Check: want negative limits refused, others kept")
	}
}

// TestUseTouchPersistsOncePerPeriod: of many uses, concurrent ones
// included, one in each period is to be written to the record.
func TestUseTouchPersistsOncePerPeriod(t *testing.T) {
	var u Use
	if !u.Last().IsZero() || u.Busy() {
		t.Fatal("zero Use: want no use, not busy")
	}
	t0 := time.Unix(1000, 0)
	var persisted atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if u.Touch(t0, 2*time.Second) {
				persisted.Add(1)
			}
		}()
	}
	wg.Wait()
	if persisted.Load() != 1 || !u.Last().Equal(t0) {
		t.Errorf("%d of 50 concurrent uses persisted (want 1); last %v", persisted.Load(), u.Last())
	}
	if u.Touch(t0.Add(time.Second), 2*time.Second) || !u.Touch(t0.Add(2*time.Second), 2*time.Second) {
		t.Error("want a use within the period kept in the handle, the next one persisted")
	}
	u.Begin()
	if !u.Busy() {
		t.Error("Begin: not busy")
	}
	u.End()
	u.Mark(t0.Add(time.Hour))
	if u.Busy() || !u.Last().Equal(t0.Add(time.Hour)) {
		t.Error("End/Mark")
	}
}

func TestLoopRunsUntilStopCancelsItsPass(t *testing.T) {
	passes := make(chan struct{}, 100)
	var cancelled atomic.Bool
	l := Every(time.Millisecond, func(ctx context.Context) {
		passes <- struct{}{}
		<-ctx.Done() // a long pass: Stop must cancel it
		cancelled.Store(true)
	})
	select {
	case <-passes:
	case <-time.After(5 * time.Second):
		t.Fatal("no pass")
	}
	l.Stop()
	if !cancelled.Load() {
		t.Error("Stop returned before the pass in progress ended")
	}
	(*Loop)(nil).Stop()
}

// TestDueCountsTheHandlesUse: a use through the handle, later than the
// record's, keeps an idle box; a call in flight is recorded first.
func TestDueCountsTheHandlesUse(t *testing.T) {
	now := time.Unix(1000, 0)
	l := Limits{Idle: time.Minute}
	d := Deadlines{LastUse: now.Add(-2 * time.Minute)}
	if Due(l, d, nil, now, nil) != ReasonIdle {
		t.Error("no handle: want idle")
	}
	var u Use
	u.Mark(now.Add(-30 * time.Second))
	if why := Due(l, d, &u, now, func() { t.Error("touched an idle handle") }); why != "" {
		t.Errorf("used 30s ago through the handle: %q", why)
	}
	var busy Use
	busy.Begin()
	touched := false
	if why := Due(l, d, &busy, now, func() { touched = true; busy.Mark(now) }); why != "" || !touched {
		t.Errorf("call in flight: %q, touched %v", why, touched)
	}
}

func TestHandoverRestartsLeaseAndIdleOnly(t *testing.T) {
	now := time.Unix(1000, 0)
	ttl := now.Add(time.Hour)
	d := Deadlines{ExpiresAt: ttl, LeaseUntil: now, LastUse: now}
	Handover(Limits{TTL: time.Hour, Lease: time.Minute, Idle: time.Second}, &d, now.Add(time.Minute))
	if !d.ExpiresAt.Equal(ttl) || !d.LeaseUntil.Equal(now.Add(2*time.Minute)) || !d.LastUse.Equal(now.Add(time.Minute)) {
		t.Errorf("after the handover: %+v", d)
	}
}
