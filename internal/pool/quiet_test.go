package pool

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Claims first, refill after (quiet.go), on the fake clock: a refill
// waits while a claim is in progress and for a quiet period after the
// last one; a box restored before a burst of claims waits for them before
// its warm-up; claims that never stop defer fills by at most MaxDefer; a
// claim never waits for the Room's lock that a fill holds.

// timerAdded waits until a fill loop waits on the clock after ch (from
// clk.onAdd) was taken: it has made its decision and blocks on time.
func (e *env) timerAdded(what string, ch <-chan struct{}) {
	e.t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		e.t.Fatalf("no fill loop waits on the clock: %s: %+v", what, e.s.Status())
	}
}

// restores are the factory's restores and warm-ups so far.
func (f *factory) restoresWarms() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restores, f.warms
}

func TestRefillWaitsForClaims(t *testing.T) {
	ctx := context.Background()
	h := newHost()
	f := newFactory(h, true)
	e := start(t, h, nil, spec("a", 3, f))
	e.wait()
	r0, _ := f.restoresWarms()

	// A claim in progress (take has not returned): its refill waits, as
	// long as time passes short of MaxDefer.
	inTake, release := make(chan struct{}), make(chan struct{})
	var rel sync.Once
	releaseTake := func() { rel.Do(func() { close(release) }) }
	defer releaseTake() // a failed test lets the claim end
	done := make(chan struct{})
	added := e.clk.onAdd()
	go func() {
		defer close(done)
		if _, ok, err := e.s.Claim(ctx, "a", func(ctx context.Context, b *fakeBox, r bool) (bool, error) {
			close(inTake)
			<-release
			return true, nil
		}); !ok || err != nil {
			t.Errorf("claim: %v %v", ok, err)
		}
	}()
	<-inTake
	e.timerAdded("during the claim", added)
	for range 3 {
		added = e.clk.onAdd()
		e.clk.fire()
		e.timerAdded("during the claim, time passing", added)
	}
	if r, _ := f.restoresWarms(); r != r0 {
		t.Fatalf("%d restores while a claim was in progress, want none", r-r0)
	}
	if st := e.s.Status()[0]; st.Filling != 0 || st.Ready != 2 {
		t.Fatalf("during a claim: %+v, want 2 ready, none filling", st)
	}

	// The claim ends during a period: that period does not count as
	// quiet; the refill waits for another one.
	releaseTake()
	<-done
	added = e.clk.onAdd()
	e.clk.fire()
	e.timerAdded("after the claim", added)
	if r, _ := f.restoresWarms(); r != r0 {
		t.Fatalf("%d restores within a period of a claim's end, want none before a quiet period", r-r0)
	}
	e.until("refilled after the quiet period", true, func(st []Status) bool { return st[0].Ready == 3 })
	if r, w := f.restoresWarms(); r != r0+1 || w != 4 {
		t.Fatalf("%d restores, %d warm-ups: want 1 more restore, 4 warm-ups in all", r-r0, w)
	}
}

func TestWarmWaitsForClaims(t *testing.T) {
	ctx := context.Background()
	h := newHost()
	f := newFactory(h, true)
	e := start(t, h, nil, spec("a", 2, f))
	e.wait()

	// A refill is restoring when a burst of claims comes: its warm-up
	// waits until the claims are over and a quiet period has passed.
	var once sync.Once
	inRestore, resume := make(chan struct{}), make(chan struct{})
	f.set(func(f *factory) {
		f.onRestore = func() {
			once.Do(func() {
				close(inRestore)
				<-resume
			})
		}
	})
	if _, ok, err := e.s.Claim(ctx, "a", take); !ok || err != nil {
		t.Fatalf("claim: %v %v", ok, err)
	}
	e.until("a refill restoring", true, func([]Status) bool {
		select {
		case <-inRestore:
			return true
		default:
			return false
		}
	})
	_, w0 := f.restoresWarms()
	inTake, release := make(chan struct{}), make(chan struct{})
	var rel sync.Once
	releaseTake := func() { rel.Do(func() { close(release) }) }
	defer releaseTake() // a failed test lets the claim end
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.s.Claim(ctx, "a", func(ctx context.Context, b *fakeBox, r bool) (bool, error) {
			close(inTake)
			<-release
			return true, nil
		})
	}()
	<-inTake
	added := e.clk.onAdd()
	close(resume) // the restore ends during the claim
	e.timerAdded("the restored box waiting", added)
	if _, w := f.restoresWarms(); w != w0 {
		t.Fatal("a restored box was warmed while a claim was in progress")
	}
	if st := e.s.Status()[0]; st.Filling != 1 || st.Ready != 0 {
		t.Fatalf("%+v: want the restored box still filling", st)
	}
	releaseTake()
	<-done
	e.until("refilled", true, func(st []Status) bool { return st[0].Ready == 2 })
}

func TestClaimsDeferFillsAtMostMaxDefer(t *testing.T) {
	ctx := context.Background()
	h := newHost()
	f := newFactory(h, true)
	e := start(t, h, nil, spec("a", 2, f))
	e.wait()
	// A claim that does not end: the refill goes after MaxDefer
	// (DefaultMaxDefer / DefaultQuiet periods of the fake clock).
	inTake, release := make(chan struct{}), make(chan struct{})
	var rel sync.Once
	releaseTake := func() { rel.Do(func() { close(release) }) }
	defer releaseTake() // a failed test lets the claim end
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.s.Claim(ctx, "a", func(ctx context.Context, b *fakeBox, r bool) (bool, error) {
			close(inTake)
			<-release
			return true, nil
		})
	}()
	<-inTake
	e.until("refilled although a claim is in progress", true, func(st []Status) bool { return st[0].Ready == 2 })
	releaseTake()
	<-done
}

// blockingRoom is a Room whose Fill check blocks while hold is set.
type blockingRoom struct {
	*host
	mu      sync.Mutex
	hold    chan struct{} // nil: no block
	entered chan struct{}
}

func (r *blockingRoom) Fill(ctx context.Context, memMiB int, c Counts) string {
	r.mu.Lock()
	hold, entered := r.hold, r.entered
	r.hold = nil
	r.mu.Unlock()
	if hold != nil {
		close(entered)
		<-hold
	}
	return r.host.Fill(ctx, memMiB, c)
}

func TestClaimDoesNotWaitForRoom(t *testing.T) {
	ctx := context.Background()
	h := newHost()
	room := &blockingRoom{host: h}
	fa, fb := newFactory(h, true), newFactory(h, true)
	s := New([]Spec[*fakeBox]{spec("a", 2, fa), spec("b", 1, fb)}, room, Options{Fills: 2, Quiet: -1})
	s.Start()
	t.Cleanup(func() { s.Stop(ctx) })
	e := &env{t: t, s: s, h: h, clk: newClock()}
	e.wait()

	// Pool b's refill checks the room and the check hangs (holding the
	// Room's lock): a claim of pool a returns regardless.
	hold, entered := make(chan struct{}), make(chan struct{})
	room.mu.Lock()
	room.hold, room.entered = hold, entered
	room.mu.Unlock()
	if _, ok, err := s.Claim(ctx, "b", take); !ok || err != nil {
		t.Fatalf("claim b: %v %v", ok, err)
	}
	<-entered
	var once sync.Once
	unhold := func() { once.Do(func() { close(hold) }) }
	defer unhold() // a failed test lets the check end, so Stop can
	claimed := make(chan bool, 1)
	go func() {
		_, ok, _ := s.Claim(ctx, "a", take)
		claimed <- ok
	}()
	select {
	case ok := <-claimed:
		if !ok {
			t.Fatal("no box claimed from pool a")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a claim waited for a fill's check of the room")
	}
	unhold()
	e.until("both refilled", false, func(st []Status) bool { return st[0].Ready == 2 && st[1].Ready == 1 })
}
