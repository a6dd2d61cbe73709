// Package pool is the warm-pool scheduler: it keeps pools of ready boxes
// filled, hands a ready box to a claim, and keeps the pools within the
// host's room (docs/pool.md).
//
// It knows no VM and no box store. What a box is, and how one is made,
// belongs to its caller, behind two interfaces: a Factory per pool makes
// the pool's template, restores or boots its boxes, warms and removes
// them; a Room for the whole set says whether there is room for one more
// box (a fill, a start) and whether a start should evict ready pool boxes.
// Maker (a Factory over functions) and Caps (the Room of the host caps and
// a home's budget, over counts passed in) implement them for the root
// package, over its Runtime and Box.
//
// The rules (docs/pool.md, "Caps"):
//
//   - a fill is made only when the Room has room for it, counting the
//     fills and the starts of this Set in progress; otherwise the pool is
//     held back (Status.HeldBack) until the next check: every second, after
//     each claim and after each fill;
//   - the first fill of a pool makes its template (Factory.Template) while
//     the others wait; later fills restore from it, concurrently, at most
//     Options.Fills at a time across pools; a restore that fails drops the
//     template (removed, made again by the next fill) unless the Room says
//     the failure was for want of room;
//   - a failed fill backs off (1 s, doubling, at most 30 s); a fill held
//     back does not;
//   - claims first, refill after: a fill neither starts nor warms its box
//     while a claim is in progress or within Options.Quiet of the last
//     one (at most Options.MaxDefer), and a claim never waits for a lock
//     or a slot that a fill holds (quiet.go);
//   - a start (Set.Launch) checks the Room and holds its place until its
//     machine runs, so that concurrent starts cannot pass a cap together;
//     a start that the Room says evicting would help first removes ready
//     pool boxes, one at a time, the newest of the pool with the most.
package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Box is a pool box as the scheduler sees it: an id (Status.Boxes,
// Set.FromPool); the rest is the Factory's.
type Box interface {
	ID() string
}

// ErrNoTemplate, wrapped in an error of Factory.Template, says the
// pool's boxes cannot be restored from a template (the VM driver cannot
// snapshot): the pool boots each box instead, and asks no more.
var ErrNoTemplate = errors.New("no template: pool boxes are booted")

// Factory makes and removes the boxes of one pool.
type Factory[B Box] interface {
	// Template makes the pool's template (a box booted, prepared,
	// snapshotted and removed) and returns its name. An error wrapping
	// ErrNoTemplate makes the pool boot its boxes.
	Template(ctx context.Context) (string, error)
	// Restore makes a running box from the template.
	Restore(ctx context.Context, template string) (B, error)
	// Boot makes a running, prepared box by booting it.
	Boot(ctx context.Context) (B, error)
	// Warm runs once a box is up, before it can be claimed; its value is
	// handed to the claimer (Set.TakeWarm). On error the box is removed.
	Warm(ctx context.Context, b B) (any, error)
	// Remove removes a box (killing its machine).
	Remove(ctx context.Context, b B) error
	// RemoveTemplate removes a template Template made.
	RemoveTemplate(ctx context.Context, name string) error
}

// Counts are what a Set holds and does now, for the Room's checks.
type Counts struct {
	// Held are the boxes the pools hold: ready, being filled, being
	// claimed.
	Held int
	// Filling are the fills in progress (their machine may not run yet)
	// and FillingMiB their guest memory.
	Filling, FillingMiB int
	// Starting are the starts that passed Launch and whose machine does
	// not run yet, and StartingMiB their guest memory.
	Starting, StartingMiB int
}

// Room says whether there is room for one more box. A Set calls it with
// its own lock held: one check at a time, each followed by the fill or
// the start it allows.
type Room interface {
	// Fill says why one more pool box of memMiB of guest memory does not
	// fit now ("" when it does).
	Fill(ctx context.Context, memMiB int, c Counts) string
	// Evict reports whether starting box id of memMiB passes a cap that
	// removing ready pool boxes could help with: the Set then removes one
	// and asks again.
	Evict(ctx context.Context, id string, memMiB int, c Counts) bool
	// Start returns the error that refuses starting box id of memMiB now
	// (nil: it may start).
	Start(id string, memMiB int, c Counts) error
	// Full reports whether err, from a restore or a boot, is a start
	// refused for want of room (another process took it after the
	// check): the pool is held back, not failed.
	Full(err error) bool
}

// Clock is the time a Set waits on; nil in Options is the real one.
type Clock interface {
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Spec is one pool.
type Spec[B Box] struct {
	// Key identifies the pool (Set.Claim, Status.Key).
	Key string
	// Name names the pool in warnings and Status (the root package: its
	// image).
	Name string
	// Size is how many boxes are kept ready (at least 1).
	Size int
	// MemoryMiB is a pool box's guest memory (for the Room).
	MemoryMiB int
	// Factory makes the pool's boxes.
	Factory Factory[B]
}

// Options configure a Set.
type Options struct {
	// Fills bounds the fills in progress at once, across pools (at least
	// 1).
	Fills int
	// Warn gets what a user should hear: a pool that cannot fill, a box
	// that eviction could not remove. Nil: nothing is said.
	Warn func(string)
	// Live reports whether the caller still holds box id (a claimed box);
	// the Set forgets claimed boxes that are not live, once it remembers
	// many (PruneAt). Nil: all are live.
	Live func(id string) bool
	// Clock is what the fill loops wait on; nil: real time.
	Clock Clock
	// Quiet is how long after the last claim a fill waits before it
	// starts or warms a box (claims first, refill after); 0:
	// DefaultQuiet; negative: fills do not wait for claims.
	Quiet time.Duration
	// MaxDefer bounds how long claims that keep coming defer a fill
	// (about: it waits whole Quiet periods); 0: DefaultMaxDefer.
	MaxDefer time.Duration
}

// PruneAt is how many claimed boxes a Set remembers (FromPool, TakeWarm)
// before it asks Options.Live which it may forget.
const PruneAt = 256

// Status is the state of one pool.
type Status struct {
	Key, Name string
	// Size is the target; Ready the boxes that can be claimed now;
	// Filling those being restored or booted.
	Size, Ready, Filling int
	// Template is the template's name ("" while none is made, or when
	// boxes are booted); Booted is true when boxes are booted (the
	// Factory said ErrNoTemplate).
	Template string
	Booted   bool
	// Claimed counts claims since the Set was made.
	Claimed int
	// LastError is the last failure to fill the pool ("" when none, or
	// the last fill succeeded).
	LastError string
	// HeldBack is why the Room has no room for a fill ("" when it has).
	HeldBack string
	// Evicted counts ready boxes removed to make room for a start.
	Evicted int
	// Boxes are the ids of the ready boxes, oldest first.
	Boxes []string
}

// Set is a runtime's warm pools. A nil *Set has no pools.
type Set[B Box] struct {
	pools  map[string]*pool[B] // by key
	order  []*pool[B]
	room   Room
	o      Options
	clock  Clock
	sem    chan struct{} // bounds concurrent fills across pools
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// roomMu serializes the Room's checks with the fill or the start
	// they allow.
	roomMu sync.Mutex

	mu   sync.Mutex
	warm map[string]any // claimed box id -> its Warm value, until taken
	from map[string]bool
	// launching and launchingMiB are the starts that passed Launch and
	// whose machine does not run yet, and their guest memory.
	launching, launchingMiB int
	// change is closed, and replaced, when a pool's state changes (Wait).
	change chan struct{}

	// quiet and maxDefer are Options.Quiet and MaxDefer with defaults
	// (quiet 0: fills do not wait for claims).
	quiet, maxDefer time.Duration
	// claimsNow are the claims in progress; claimSeq counts their
	// beginnings and ends; calmSeq is the claimSeq after which a quiet
	// period passed (quiet.go).
	claimsNow         int
	claimSeq, calmSeq uint64
}

type pool[B Box] struct {
	s    *Set[B]
	spec Spec[B]
	kick chan struct{}

	mu       sync.Mutex
	ready    []entry[B]
	filling  int
	template string // "" when none
	booted   bool
	claimed  int
	claiming int // popped from ready, not yet the claimer's
	evicted  int
	lastErr  string
	heldBack string
	fails    int
	tmplMu   sync.Mutex // serializes template builds
	tmplBad  bool       // no template can be made: boot the boxes
}

type entry[B Box] struct {
	b    B
	warm any
	// restored: from the template (else booted).
	restored bool
}

// New makes a Set of the pools specs (keys distinct, sizes at least 1),
// not started.
func New[B Box](specs []Spec[B], room Room, o Options) *Set[B] {
	s := &Set[B]{pools: map[string]*pool[B]{}, room: room, o: o, clock: o.Clock,
		sem: make(chan struct{}, max(o.Fills, 1)), warm: map[string]any{}, from: map[string]bool{}, change: make(chan struct{})}
	if s.clock == nil {
		s.clock = realClock{}
	}
	s.quiet, s.maxDefer = o.Quiet, o.MaxDefer
	if s.quiet == 0 {
		s.quiet = DefaultQuiet
	}
	s.quiet = max(s.quiet, 0)
	if s.maxDefer <= 0 {
		s.maxDefer = DefaultMaxDefer
	}
	for _, sp := range specs {
		p := &pool[B]{s: s, spec: sp, kick: make(chan struct{}, 1)}
		s.pools[sp.Key] = p
		s.order = append(s.order, p)
	}
	return s
}

// Start starts filling the pools.
func (s *Set[B]) Start() {
	if s == nil {
		return
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for _, p := range s.order {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			p.run()
		}()
	}
}

// Stop ends the fills, waits for them, and removes the ready boxes and
// the templates (within ctx).
func (s *Set[B]) Stop(ctx context.Context) {
	if s == nil || s.cancel == nil {
		return
	}
	s.cancel()
	s.wg.Wait()
	for _, p := range s.order {
		p.mu.Lock()
		ready, tmpl := p.ready, p.template
		p.ready, p.template = nil, ""
		p.mu.Unlock()
		for _, e := range ready {
			p.spec.Factory.Remove(ctx, e.b)
		}
		if tmpl != "" {
			p.spec.Factory.RemoveTemplate(ctx, tmpl)
		}
	}
	s.changed()
}

// changed wakes the Waits.
func (s *Set[B]) changed() {
	s.mu.Lock()
	close(s.change)
	s.change = make(chan struct{})
	s.mu.Unlock()
}

func (s *Set[B]) warn(msg string) {
	if s.o.Warn != nil {
		s.o.Warn(msg)
	}
}

// poke wakes p's fill loop.
func (p *pool[B]) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run keeps the pool filled until the Set stops.
func (p *pool[B]) run() {
	ctx := p.s.ctx
	var fills sync.WaitGroup
	defer fills.Wait()
	for ctx.Err() == nil {
		p.mu.Lock()
		short := len(p.ready)+p.filling < p.spec.Size
		p.mu.Unlock()
		if short && !p.s.calm() {
			// Claims first: the pool says at once whether a cap holds
			// its refill back (a claim does not ask the Room itself),
			// then the refill waits for the claims to settle.
			p.checkRoom(ctx)
			if !p.s.awaitQuiet(ctx) {
				return
			}
		}
		p.mu.Lock()
		need := p.spec.Size - len(p.ready) - p.filling
		first := p.template == "" && !p.booted
		backoff := time.Duration(0)
		if p.fails > 0 {
			backoff = min(time.Second<<min(p.fails-1, 5), 30*time.Second)
		}
		p.mu.Unlock()
		if need > 0 && backoff > 0 {
			select {
			case <-ctx.Done():
				return
			case <-p.s.clock.After(backoff):
			}
		}
		madeFirst := false
		for ; need > 0; need-- {
			select {
			case p.s.sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			if !p.reserve(ctx) {
				// No room: no fill until the next check.
				<-p.s.sem
				break
			}
			if first {
				// This fill makes the template: the others wait for it.
				p.fillOne(ctx)
				<-p.s.sem
				madeFirst = true
				break
			}
			fills.Add(1)
			go func() {
				defer fills.Done()
				defer func() { <-p.s.sem }()
				p.fillOne(ctx)
			}()
		}
		if madeFirst {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-p.s.clock.After(time.Second):
		}
	}
}

// fillOne adds one box to the pool.
func (p *pool[B]) fillOne(ctx context.Context) {
	e, err := p.make(ctx)
	p.mu.Lock()
	p.filling--
	if err != nil && p.s.room.Full(err) {
		// Another process took the room between the check and the
		// start: held back, not failed.
		p.heldBack = err.Error()
		p.mu.Unlock()
		p.s.changed()
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			p.fails++
			p.lastErr = err.Error()
			if p.fails == 1 || p.fails%10 == 0 {
				p.s.warn(fmt.Sprintf("pool %s: cannot fill it (will retry): %v", p.spec.Name, err))
			}
		}
		p.mu.Unlock()
		p.s.changed()
		return
	}
	p.fails, p.lastErr = 0, ""
	if ctx.Err() != nil {
		p.mu.Unlock()
		p.spec.Factory.Remove(context.Background(), e.b)
		p.s.changed()
		return
	}
	p.ready = append(p.ready, e)
	p.mu.Unlock()
	p.s.recheck()
}

// recheck has every pool check the room again now: a fill that ended
// counts as a running machine only, no longer as one in progress too.
// Until then a pool is not held back (Wait waits for the check).
func (s *Set[B]) recheck() {
	for _, p := range s.order {
		p.mu.Lock()
		p.heldBack = ""
		p.mu.Unlock()
		p.poke()
	}
	s.changed()
}

// make restores (or boots) one box of the pool and warms it.
func (p *pool[B]) make(ctx context.Context) (entry[B], error) {
	f := p.spec.Factory
	tmpl, err := p.templateName(ctx)
	if err != nil {
		return entry[B]{}, err
	}
	var b B
	if tmpl != "" {
		b, err = f.Restore(ctx, tmpl)
		if err != nil {
			// A template removed or made stale (a new kernel, agent or
			// QEMU) is made again on the next fill; a restore refused
			// for want of room says nothing of the template.
			if ctx.Err() == nil && !p.s.room.Full(err) {
				p.mu.Lock()
				if p.template == tmpl {
					p.template = ""
				}
				p.mu.Unlock()
				f.RemoveTemplate(context.WithoutCancel(ctx), tmpl)
			}
			return entry[B]{}, err
		}
	} else {
		if b, err = f.Boot(ctx); err != nil {
			return entry[B]{}, err
		}
	}
	// Claims that came while the box started go first: the warm-up
	// (a CodeBox pool's interpreter start) waits for them.
	if !p.s.awaitQuiet(ctx) {
		f.Remove(context.WithoutCancel(ctx), b)
		return entry[B]{}, ctx.Err()
	}
	warm, err := f.Warm(ctx, b)
	if err != nil {
		f.Remove(context.WithoutCancel(ctx), b)
		return entry[B]{}, fmt.Errorf("warm pool box: %w", err)
	}
	return entry[B]{b: b, warm: warm, restored: tmpl != ""}, nil
}

// templateName returns the pool's template, making it if there is none;
// "" when the pool boots its boxes.
func (p *pool[B]) templateName(ctx context.Context) (string, error) {
	p.tmplMu.Lock()
	defer p.tmplMu.Unlock()
	p.mu.Lock()
	tmpl, bad := p.template, p.tmplBad
	p.mu.Unlock()
	if tmpl != "" || bad {
		return tmpl, nil
	}
	name, err := p.spec.Factory.Template(ctx)
	if errors.Is(err, ErrNoTemplate) {
		p.mu.Lock()
		p.tmplBad, p.booted = true, true
		p.mu.Unlock()
		return "", nil
	}
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	p.template = name
	p.mu.Unlock()
	return name, nil
}

// Has reports whether there is a pool of key.
func (s *Set[B]) Has(key string) bool {
	return s != nil && s.pools[key] != nil
}

// Claim takes a ready box of the pool of key and passes it to take (with
// whether it was restored from the template), which makes it the
// caller's. When take fails the box is removed, and the next ready box is
// tried if take says next and ctx has not ended; otherwise take's error is
// returned. ok is false, with no error, when there is no such pool or no
// box is ready.
func (s *Set[B]) Claim(ctx context.Context, key string, take func(ctx context.Context, b B, restored bool) (next bool, err error)) (b B, ok bool, err error) {
	if !s.Has(key) {
		return b, false, nil
	}
	p := s.pools[key]
	for {
		p.mu.Lock()
		if len(p.ready) == 0 {
			p.mu.Unlock()
			return b, false, nil
		}
		e := p.ready[0]
		p.ready = p.ready[1:]
		p.claimed++
		p.claiming++
		p.mu.Unlock()
		s.claimBegins()
		p.poke()
		next, err := take(ctx, e.b, e.restored)
		p.mu.Lock()
		p.claiming--
		p.mu.Unlock()
		s.claimEnds()
		if err == nil {
			s.prune()
			id := e.b.ID()
			s.mu.Lock()
			s.from[id] = true
			if e.warm != nil {
				s.warm[id] = e.warm
			}
			s.mu.Unlock()
			// The pool's fill loop, poked, checks whether it may refill
			// (HeldBack): the claim does not wait for the Room's lock.
			p.poke()
			s.changed()
			return e.b, true, nil
		}
		p.spec.Factory.Remove(context.WithoutCancel(ctx), e.b)
		s.changed()
		if !next || ctx.Err() != nil {
			return b, false, err
		}
		// A pool box that died or broke while it waited: try the next.
	}
}

// prune forgets the claimed boxes that are no longer live
// (Options.Live), once there are PruneAt.
func (s *Set[B]) prune() {
	if s.o.Live == nil {
		return
	}
	s.mu.Lock()
	if len(s.from) < PruneAt {
		s.mu.Unlock()
		return
	}
	ids := make([]string, 0, len(s.from))
	for id := range s.from {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	var gone []string
	for _, id := range ids {
		if !s.o.Live(id) {
			gone = append(gone, id)
		}
	}
	s.mu.Lock()
	for _, id := range gone {
		delete(s.from, id)
		delete(s.warm, id)
	}
	s.mu.Unlock()
}

// TakeWarm returns, once, the Warm value of claimed box id; nil when it
// had none, was not claimed from this Set, or on later calls.
func (s *Set[B]) TakeWarm(id string) any {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.warm[id]
	delete(s.warm, id)
	return w
}

// FromPool reports whether box id was claimed from this Set (and not
// forgotten since: Options.Live).
func (s *Set[B]) FromPool(id string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.from[id]
}

// Status returns the state of the pools, in the order of their specs.
func (s *Set[B]) Status() []Status {
	if s == nil {
		return nil
	}
	out := make([]Status, 0, len(s.order))
	for _, p := range s.order {
		p.mu.Lock()
		ids := make([]string, len(p.ready))
		for i, e := range p.ready {
			ids[i] = e.b.ID()
		}
		out = append(out, Status{Key: p.spec.Key, Name: p.spec.Name, Size: p.spec.Size, Ready: len(p.ready), Filling: p.filling,
			Template: p.template, Booted: p.booted, Claimed: p.claimed, LastError: p.lastErr,
			HeldBack: p.heldBack, Evicted: p.evicted, Boxes: ids})
		p.mu.Unlock()
	}
	return out
}

// Wait waits until every pool is full, or held back with no fill in
// progress, or ctx ends (its error).
func (s *Set[B]) Wait(ctx context.Context) error {
	if s == nil {
		return nil
	}
	for {
		s.mu.Lock()
		ch := s.change
		s.mu.Unlock()
		full := true
		for _, st := range s.Status() {
			full = full && (st.Ready >= st.Size || st.HeldBack != "" && st.Filling == 0)
		}
		if full {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}
