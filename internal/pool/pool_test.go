package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The scheduler against a fake host: no VM, no sleeps. Time is a fake
// clock the tests fire; waits are on the Set's change channel, with a
// deadline that only a broken scheduler reaches.

type fakeBox struct{ id string }

func (b *fakeBox) ID() string { return b.id }

var errFull = errors.New("fake host: at the cap")

// host is the machines that run (every factory's boxes) and a cap on
// them: the fake Room.
type host struct {
	mu      sync.Mutex
	alive   map[string]bool
	extra   int // machines that are not pool boxes (a user's)
	cap     int // 0: none
	peak    int
	n       int
	refused int // starts refused at the cap
}

func newHost() *host { return &host{alive: map[string]bool{}} }

func (h *host) setCap(n int) {
	h.mu.Lock()
	h.cap = n
	h.mu.Unlock()
}

func (h *host) running() int { return len(h.alive) + h.extra }

func (h *host) start(kind string) (*fakeBox, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cap > 0 && h.running()+1 > h.cap {
		h.refused++
		return nil, errFull
	}
	h.n++
	b := &fakeBox{id: fmt.Sprintf("%s%d", kind, h.n)}
	h.alive[b.id] = true
	h.peak = max(h.peak, h.running())
	return b, nil
}

func (h *host) remove(b *fakeBox) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.alive[b.id] {
		return fmt.Errorf("box %s: no such box", b.id)
	}
	delete(h.alive, b.id)
	return nil
}

func (h *host) isAlive(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.alive[id]
}

// stats are the most machines that ran at once and the starts refused.
func (h *host) stats() (peak, refused int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak, h.refused
}

// run counts one more machine that is not a pool box.
func (h *host) run() {
	h.mu.Lock()
	h.extra++
	h.mu.Unlock()
}

func (h *host) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.alive)
}

func (h *host) Fill(ctx context.Context, memMiB int, c Counts) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cap > 0 && h.running()+c.Filling+c.Starting+1 > h.cap {
		return fmt.Sprintf("at the cap of %d: %d run, %d filling, %d starting", h.cap, h.running(), c.Filling, c.Starting)
	}
	return ""
}

func (h *host) Evict(ctx context.Context, id string, memMiB int, c Counts) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cap > 0 && h.running()+c.Starting+1 > h.cap
}

func (h *host) Start(id string, memMiB int, c Counts) error {
	if h.Evict(context.Background(), id, memMiB, c) {
		return errFull
	}
	return nil
}

func (h *host) Full(err error) bool { return errors.Is(err, errFull) }

// factory makes one pool's boxes on a host.
type factory struct {
	h    *host
	snap bool // can make templates (else ErrNoTemplate)

	mu          sync.Mutex
	templates   map[string]bool // that exist
	made        []string        // every template made
	removedTmpl []string
	boots       int
	restores    int
	bootErr     error // Boot fails with it, when set
	restoreErr  error // Restore fails with it, when set
	warmErr     error
	warms       int
	// onRestore, when set, runs at the start of each Restore (outside
	// the lock): a test holds a fill there.
	onRestore func()
}

func newFactory(h *host, snap bool) *factory {
	return &factory{h: h, snap: snap, templates: map[string]bool{}}
}

func (f *factory) Template(ctx context.Context) (string, error) {
	if !f.snap {
		return "", fmt.Errorf("%w: the driver cannot snapshot", ErrNoTemplate)
	}
	b, err := f.h.start("tmplbox")
	if err != nil {
		return "", err
	}
	defer f.h.remove(b)
	f.mu.Lock()
	defer f.mu.Unlock()
	name := fmt.Sprintf("tmpl%d", len(f.made)+1)
	f.made = append(f.made, name)
	f.templates[name] = true
	return name, nil
}

func (f *factory) Restore(ctx context.Context, tmpl string) (*fakeBox, error) {
	f.mu.Lock()
	hook := f.onRestore
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	f.mu.Lock()
	f.restores++
	ok, err := f.templates[tmpl], f.restoreErr
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("restore %s: no such snapshot", tmpl)
	}
	return f.h.start("box")
}

func (f *factory) Boot(ctx context.Context) (*fakeBox, error) {
	f.mu.Lock()
	f.boots++
	err := f.bootErr
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return f.h.start("box")
}

func (f *factory) Warm(ctx context.Context, b *fakeBox) (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.warmErr != nil {
		return nil, f.warmErr
	}
	f.warms++
	return "warm-" + b.id, nil
}

func (f *factory) Remove(ctx context.Context, b *fakeBox) error { return f.h.remove(b) }

func (f *factory) RemoveTemplate(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.templates, name)
	f.removedTmpl = append(f.removedTmpl, name)
	return nil
}

// counts are the restores, the boots and the templates made so far.
func (f *factory) counts() (restores, boots, made int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restores, f.boots, len(f.made)
}

// existing counts the templates that exist.
func (f *factory) existing() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.templates)
}

func (f *factory) set(fn func(f *factory)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

// clock is a fake Clock: its timers fire when the test says.
type clock struct {
	mu     sync.Mutex
	timers []chan time.Time
	added  chan struct{} // closed and replaced when a timer is added
}

func newClock() *clock { return &clock{added: make(chan struct{})} }

func (c *clock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	c.timers = append(c.timers, ch)
	close(c.added)
	c.added = make(chan struct{})
	c.mu.Unlock()
	return ch
}

// fire fires every timer set so far.
func (c *clock) fire() {
	c.mu.Lock()
	ts := c.timers
	c.timers = nil
	c.mu.Unlock()
	for _, ch := range ts {
		ch <- time.Time{}
	}
}

func (c *clock) onAdd() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.added
}

type env struct {
	t     *testing.T
	s     *Set[*fakeBox]
	h     *host
	clk   *clock
	mu    sync.Mutex
	warns []string
}

func spec(key string, size int, f *factory) Spec[*fakeBox] {
	return Spec[*fakeBox]{Key: key, Name: "img-" + key, Size: size, MemoryMiB: 256, Factory: f}
}

// start makes and starts a Set of specs on h; the test's end stops it.
func start(t *testing.T, h *host, live func(string) bool, specs ...Spec[*fakeBox]) *env {
	e := &env{t: t, h: h, clk: newClock()}
	e.s = New(specs, h, Options{Fills: 2, Clock: e.clk, Live: live, Warn: func(m string) {
		e.mu.Lock()
		e.warns = append(e.warns, m)
		e.mu.Unlock()
	}})
	e.s.Start()
	t.Cleanup(func() { e.s.Stop(context.Background()) })
	return e
}

// until waits for cond on the Set's status. With tick, time passes
// whenever the fill loops wait on the clock (backoff, the periodic
// check); without, it stands still.
func (e *env) until(what string, tick bool, cond func(st []Status) bool) []Status {
	e.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		e.s.mu.Lock()
		ch := e.s.change
		e.s.mu.Unlock()
		added := e.clk.onAdd()
		st := e.s.Status()
		if cond(st) {
			return st
		}
		var timer <-chan struct{}
		if tick {
			e.clk.fire()
			timer = added
		}
		select {
		case <-ch:
		case <-timer:
		case <-deadline:
			e.t.Fatalf("waiting for %s: %+v", what, st)
		}
	}
}

func (e *env) wait() []Status {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.s.Wait(ctx); err != nil {
		e.t.Fatalf("Wait: %v: %+v", err, e.s.Status())
	}
	return e.s.Status()
}

func take(ctx context.Context, b *fakeBox, restored bool) (bool, error) { return true, nil }

// TestFill: a pool with a template fills from it: one template, every
// box restored, each warmed; Stop removes the ready boxes and the
// template. Where no template can be made, boxes are booted and the
// factory is not asked again.
func TestFill(t *testing.T) {
	h := newHost()
	f := newFactory(h, true)
	e := start(t, h, nil, spec("a", 3, f))
	st := e.wait()[0]
	if st.Ready != 3 || st.Filling != 0 || st.Booted || st.Template != "tmpl1" || st.LastError != "" || st.HeldBack != "" {
		t.Fatalf("status %+v, want 3 ready from template tmpl1", st)
	}
	if len(st.Boxes) != 3 || !h.isAlive(st.Boxes[0]) {
		t.Fatalf("ready boxes %v: want 3 running", st.Boxes)
	}
	if r, b, m := f.counts(); r != 3 || b != 0 || m != 1 {
		t.Fatalf("%d restores, %d boots, %d templates: want 3 restores from one template", r, b, m)
	}
	e.s.Stop(context.Background())
	if n, tm := h.count(), f.existing(); n != 0 || tm != 0 {
		t.Fatalf("after Stop: %d boxes, %d templates left", n, tm)
	}
	if st := e.s.Status()[0]; st.Ready != 0 || st.Template != "" {
		t.Fatalf("after Stop: %+v", st)
	}

	h2 := newHost()
	f2 := newFactory(h2, false)
	e2 := start(t, h2, nil, spec("b", 2, f2))
	st = e2.wait()[0]
	if st.Ready != 2 || !st.Booted || st.Template != "" {
		t.Fatalf("status %+v, want 2 ready, booted", st)
	}
	// Claim both: the refill boots again, with no template asked for.
	for range 2 {
		if _, ok, err := e2.s.Claim(context.Background(), "b", take); !ok || err != nil {
			t.Fatalf("claim: %v %v", ok, err)
		}
	}
	e2.until("refilled", true, func(st []Status) bool { return st[0].Ready == 2 })
	if r, b, m := f2.counts(); b != 4 || r != 0 || m != 0 {
		t.Fatalf("%d boots, %d restores, %d templates: want 4 boots", b, r, m)
	}
}

// TestClaim: a claim takes the oldest ready box, hands over its Warm
// value once, and the pool refills; concurrent claims never share a box;
// a box that take refuses is removed and the next one tried, unless take
// says stop; no pool or none ready is no claim.
func TestClaim(t *testing.T) {
	ctx := context.Background()
	h := newHost()
	f := newFactory(h, true)
	e := start(t, h, nil, spec("a", 4, f))
	first := e.wait()[0].Boxes[0]

	var restored bool
	b, ok, err := e.s.Claim(ctx, "a", func(ctx context.Context, b *fakeBox, r bool) (bool, error) {
		restored = r
		return true, nil
	})
	if err != nil || !ok || b.id != first || !restored {
		t.Fatalf("Claim = %v, %v, %v (restored %v): want the oldest box %s, restored", b, ok, err, restored, first)
	}
	if !e.s.FromPool(b.id) || e.s.TakeWarm(b.id) != "warm-"+b.id || e.s.TakeWarm(b.id) != nil {
		t.Fatalf("claimed box %s: FromPool or TakeWarm wrong", b.id)
	}
	st := e.until("refilled", true, func(st []Status) bool { return st[0].Ready == 4 })[0]
	if st.Claimed != 1 || slices.Contains(st.Boxes, b.id) {
		t.Fatalf("after a claim: %+v", st)
	}

	// Concurrent claims.
	var wg sync.WaitGroup
	got := make(chan string, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, ok, err := e.s.Claim(ctx, "a", take)
			if err != nil {
				t.Error(err)
			}
			if ok {
				got <- b.id
			}
		}()
	}
	wg.Wait()
	close(got)
	seen := map[string]bool{}
	for id := range got {
		if seen[id] {
			t.Fatalf("box %s claimed twice", id)
		}
		seen[id] = true
	}
	if len(seen) == 0 {
		t.Fatal("no concurrent claim got a box")
	}

	// take refuses boxes: each is removed, the next tried.
	e.until("refilled", true, func(st []Status) bool { return st[0].Ready == 4 })
	var refused []string
	b, ok, err = e.s.Claim(ctx, "a", func(ctx context.Context, b *fakeBox, r bool) (bool, error) {
		if len(refused) < 2 {
			refused = append(refused, b.id)
			return true, errors.New("box died while it waited")
		}
		return true, nil
	})
	if err != nil || !ok || slices.Contains(refused, b.id) {
		t.Fatalf("Claim = %v, %v, %v", b, ok, err)
	}
	for _, id := range refused {
		if h.isAlive(id) {
			t.Fatalf("refused box %s not removed", id)
		}
	}
	// take says stop: its error, the box removed, none other spent.
	before := e.until("refilled", true, func(st []Status) bool { return st[0].Ready == 4 })[0].Boxes
	stop := errors.New("name in use")
	var spent string
	_, ok, err = e.s.Claim(ctx, "a", func(ctx context.Context, b *fakeBox, r bool) (bool, error) {
		spent = b.id
		return false, stop
	})
	if !errors.Is(err, stop) || ok || h.isAlive(spent) {
		t.Fatalf("Claim = %v, %v; box %s alive %v", ok, err, spent, h.isAlive(spent))
	}
	if st := e.s.Status()[0]; spent != before[0] || !slices.Equal(st.Boxes[:3], before[1:]) {
		t.Fatalf("a stopped claim spent box %s: before %v, now %+v", spent, before, st)
	}

	if _, ok, err := e.s.Claim(ctx, "nope", take); ok || err != nil || e.s.Has("nope") {
		t.Fatalf("Claim of no pool = %v, %v", ok, err)
	}
	var none *Set[*fakeBox]
	if _, ok, err := none.Claim(ctx, "a", take); ok || err != nil || none.FromPool("x") || none.Status() != nil || none.Wait(ctx) != nil {
		t.Fatal("a nil Set claims or reports something")
	}
}

// TestLostTemplateRemade: a template that cannot be restored any more
// (removed behind the pool's back, or stale) is dropped and removed, the
// failure is reported and warned of, and after the backoff the next fill
// makes a new template and restores from it. A restore refused for want
// of room keeps the template.
func TestLostTemplateRemade(t *testing.T) {
	ctx := context.Background()
	h := newHost()
	f := newFactory(h, true)
	e := start(t, h, nil, spec("a", 2, f))
	e.wait()
	f.set(func(f *factory) { delete(f.templates, "tmpl1") })
	if _, ok, _ := e.s.Claim(ctx, "a", take); !ok {
		t.Fatal("no claim")
	}
	e.until("the failed restore", true, func(st []Status) bool { return st[0].LastError != "" })
	st := e.until("a new template", true, func(st []Status) bool { return st[0].Ready == 2 && st[0].Template == "tmpl2" })[0]
	if st.LastError != "" {
		t.Fatalf("LastError %q after a fill succeeded", st.LastError)
	}
	f.mu.Lock()
	removed := slices.Clone(f.removedTmpl)
	f.mu.Unlock()
	if !slices.Equal(removed, []string{"tmpl1"}) {
		t.Fatalf("templates removed: %v, want the lost tmpl1", removed)
	}
	e.mu.Lock()
	warns := strings.Join(e.warns, "\n")
	e.mu.Unlock()
	if !strings.Contains(warns, "pool img-a: cannot fill it (will retry)") || !strings.Contains(warns, "no such snapshot") {
		t.Fatalf("warnings %q: want the failed fill", warns)
	}

	// At the cap, a restore refused by the host: held back, the template
	// kept.
	f.set(func(f *factory) { f.restoreErr = errFull })
	if _, ok, _ := e.s.Claim(ctx, "a", take); !ok {
		t.Fatal("no claim")
	}
	st = e.until("held back", true, func(st []Status) bool { return st[0].HeldBack != "" && st[0].Filling == 0 })[0]
	if _, _, m := f.counts(); st.Template != "tmpl2" || st.LastError != "" || m != 2 {
		t.Fatalf("a restore refused for room: %+v, %d templates made", st, m)
	}
	f.set(func(f *factory) { f.restoreErr = nil })
	e.until("refilled", true, func(st []Status) bool { return st[0].Ready == 2 })
}

// TestFillFails: a boot or warm that fails is reported, warned of once
// (not on every retry) and retried after a backoff; a box whose warm
// failed is removed.
func TestFillFails(t *testing.T) {
	h := newHost()
	f := newFactory(h, false)
	f.warmErr = errors.New("kernel did not start")
	e := start(t, h, nil, spec("a", 1, f))
	e.until("3 failed fills", true, func(st []Status) bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.boots >= 3
	})
	st := e.s.Status()[0]
	if !strings.Contains(st.LastError, "warm pool box: kernel did not start") || st.Ready != 0 {
		t.Fatalf("status %+v", st)
	}
	e.until("the last fill's end", false, func(st []Status) bool { return st[0].Filling == 0 })
	if alive := h.count(); alive != 0 {
		t.Fatalf("%d boxes left by failed warms", alive)
	}
	e.mu.Lock()
	n := len(e.warns)
	e.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d warnings for 3 failed fills, want 1", n)
	}
	f.set(func(f *factory) { f.warmErr = nil })
	st = e.until("filled", true, func(st []Status) bool { return st[0].Ready == 1 })[0]
	if st.LastError != "" {
		t.Fatalf("LastError %q after a fill succeeded", st.LastError)
	}
}

// TestCaps: pools fill only while the Room has room, counting the fills
// and the starts in progress: never a refused start of their own, never
// past the cap; a held-back pool says why, Wait returns, and it fills
// once there is room. A start holds its place until launched.
func TestCaps(t *testing.T) {
	ctx := context.Background()
	h := newHost()
	h.setCap(3)
	fa, fb := newFactory(h, true), newFactory(h, false)
	e := start(t, h, nil, spec("a", 3, fa), spec("b", 2, fb))
	st := e.wait()
	if n := st[0].Ready + st[1].Ready; n != 3 {
		t.Fatalf("%d ready at a cap of 3: %+v", n, st)
	}
	for _, p := range st {
		if p.Ready < p.Size && !strings.Contains(p.HeldBack, "at the cap of 3") {
			t.Fatalf("pool %s short and not held back: %+v", p.Key, p)
		}
		if p.LastError != "" {
			t.Fatalf("pool %s failed at the cap: %q", p.Key, p.LastError)
		}
	}
	if peak, refused := h.stats(); peak > 3 || refused > 0 {
		t.Fatalf("peak %d machines, %d starts refused: the pools passed the cap", peak, refused)
	}

	// Room again: both pools fill.
	h.setCap(5)
	st = e.until("both full", true, func(st []Status) bool { return st[0].Ready == 3 && st[1].Ready == 2 })
	if st[0].HeldBack != "" || st[1].HeldBack != "" {
		t.Fatalf("full pools held back: %+v", st)
	}

	// A start holds its place: a second one at the cap is refused until
	// the first is launched (then its machine counts).
	h.setCap(6)
	l1, err := e.s.Launch(ctx, "u1", 256, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Launch(ctx, "u2", 256, false); !errors.Is(err, errFull) {
		t.Fatalf("a second start past the cap: %v, want refused", err)
	}
	// The refill a claim asks for is held back by the start. (Without
	// time passing: a claim has the pool check the room at once.)
	if _, ok, _ := e.s.Claim(ctx, "b", take); !ok {
		t.Fatal("no claim")
	}
	e.until("b held back by the start", false, func(st []Status) bool {
		return strings.Contains(st[1].HeldBack, "1 starting") && st[1].Filling == 0
	})
	h.run() // u1's machine runs
	l1()
	l1() // once only
	if e.s.counts().Starting != 0 {
		t.Fatalf("counts %+v after launched", e.s.counts())
	}
	h.setCap(8)
	e.until("b full", true, func(st []Status) bool { return st[1].Ready == 2 })
	if peak, refused := h.stats(); peak > 8 || refused > 0 {
		t.Fatalf("peak %d, %d refused", peak, refused)
	}
}

// TestEvict: a start past the cap that may evict removes ready pool
// boxes, the newest of the pool with the most first, one at a time, until
// it fits; one that may not (a pool box's start) is refused; with no
// ready box left the start is refused and nothing else is touched.
func TestEvict(t *testing.T) {
	ctx := context.Background()
	h := newHost()
	h.setCap(4)
	fa, fb := newFactory(h, false), newFactory(h, false)
	e := start(t, h, nil, spec("a", 3, fa), spec("b", 1, fb))
	e.until("full", true, func(st []Status) bool { return st[0].Ready == 3 && st[1].Ready == 1 })
	before := e.s.Status()
	newest := before[0].Boxes[2]

	if _, err := e.s.Launch(ctx, "pooled", 256, false); !errors.Is(err, errFull) {
		t.Fatalf("a start that may not evict: %v, want refused", err)
	}
	launched, err := e.s.Launch(ctx, "u1", 256, true)
	if err != nil {
		t.Fatal(err)
	}
	st := e.s.Status()
	if st[0].Evicted != 1 || st[1].Evicted != 0 || h.isAlive(newest) || slices.Contains(st[0].Boxes, newest) || st[0].Ready != 2 || st[1].Ready != 1 {
		t.Fatalf("after one eviction: %+v (newest was %s)", st, newest)
	}
	h.run()
	launched()

	// Two more starts: a's newest, then (a and b tie at one) a's last.
	for _, id := range []string{"u2", "u3"} {
		l, err := e.s.Launch(ctx, id, 256, true)
		if err != nil {
			t.Fatal(err)
		}
		h.run()
		l()
	}
	st = e.s.Status()
	if st[0].Evicted != 3 || st[0].Ready != 0 || st[1].Ready != 1 {
		t.Fatalf("after three evictions: %+v", st)
	}
	l, err := e.s.Launch(ctx, "u4", 256, true)
	if err != nil || e.s.Status()[1].Evicted != 1 {
		t.Fatalf("fourth start: %v, %+v", err, e.s.Status())
	}
	h.run()
	l()
	if _, err := e.s.Launch(ctx, "u5", 256, true); !errors.Is(err, errFull) {
		t.Fatalf("a start with nothing to evict: %v, want refused", err)
	}
	if peak, _ := h.stats(); peak > 4 {
		t.Fatalf("peak %d machines at a cap of 4", peak)
	}
}

// TestPrune: the claimed boxes a Set remembers (FromPool, TakeWarm) are
// forgotten once the caller no longer holds them, when there are many;
// those it holds are kept.
func TestPrune(t *testing.T) {
	ctx := context.Background()
	h := newHost()
	var mu sync.Mutex
	dropped := map[string]bool{}
	live := func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		return !dropped[id]
	}
	f := newFactory(h, false)
	e := start(t, h, live, spec("a", 8, f))
	claim := func() string {
		for {
			b, ok, err := e.s.Claim(ctx, "a", take)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				return b.id
			}
			e.until("a ready box", true, func(st []Status) bool { return st[0].Ready > 0 })
		}
	}
	var ids []string
	for range PruneAt {
		ids = append(ids, claim())
	}
	mu.Lock()
	for _, id := range ids[:10] {
		dropped[id] = true
	}
	mu.Unlock()
	if !e.s.FromPool(ids[0]) {
		t.Fatal("forgotten before there were many")
	}
	last := claim()
	for _, id := range ids[:10] {
		if e.s.FromPool(id) || e.s.TakeWarm(id) != nil {
			t.Fatalf("dropped box %s still remembered", id)
		}
	}
	for _, id := range append(ids[10:], last) {
		if !e.s.FromPool(id) {
			t.Fatalf("held box %s forgotten", id)
		}
	}
	if w := e.s.TakeWarm(last); w != "warm-"+last {
		t.Fatalf("TakeWarm(%s) = %v", last, w)
	}
}

// TestStopDuringFill: Stop while fills are in progress waits for them
// and leaves no box behind.
func TestStopDuringFill(t *testing.T) {
	h := newHost()
	f := newFactory(h, true)
	e := start(t, h, nil, spec("a", 16, f))
	e.until("a fill", false, func(st []Status) bool { return st[0].Ready > 0 })
	e.s.Stop(context.Background())
	if n, tm := h.count(), f.existing(); n != 0 || tm != 0 {
		t.Fatalf("after Stop: %d boxes, %d templates left", n, tm)
	}
}
