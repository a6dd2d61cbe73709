package airlock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/vmm"
)

// PoolOptions configure a warm pool (Options.Pool): Size boxes of
// BoxOptions kept ready, so that Create with the same options takes one
// instead of booting. Boxes are restored from a template snapshot (made
// when the runtime opens: a box of these options booted, Prepare run in
// it, snapshotted and removed), or booted, with Prepare run in each, where
// the VM driver cannot snapshot.
type PoolOptions struct {
	// BoxOptions are what the pool's boxes are. Name, Hostname,
	// AutoRemove and FromSnapshot are ignored (a claim takes the caller's
	// Name, Hostname and AutoRemove); Volumes and Ports are refused (a
	// pooled box must not hold host directories or host ports).
	BoxOptions
	// Size is how many boxes are kept ready (1..MaxPoolSize).
	Size int
	// Prepare, when set, runs in the template box before its snapshot (in
	// each booted box where the driver cannot snapshot). What it starts
	// there, every box of the pool has. codebox.Pool uses it to start a
	// Python kernel.
	Prepare func(ctx context.Context, b *Box) error
	// Warm, when set, runs on each box once it is up, before it can be
	// claimed; what it returns is handed to the claimer (Box.TakeWarm).
	Warm func(ctx context.Context, b *Box) (any, error)
}

// MaxPoolSize bounds PoolOptions.Size.
const MaxPoolSize = 64

// DefaultPoolFills is the default of Options.PoolFills.
const DefaultPoolFills = 2

// PoolInfo is the state of one warm pool (Runtime.Pools).
type PoolInfo struct {
	Image string
	// Key identifies the pool's box options (a hash).
	Key string
	// Size is the target; Ready the boxes that can be claimed now; Filling
	// those being restored or booted.
	Size, Ready, Filling int
	// Template is the template snapshot's name ("" while none is made, or
	// when boxes are booted); Booted is true when the driver cannot
	// snapshot and pool boxes are booted.
	Template string
	Booted   bool
	// Claimed counts boxes taken by Create since the runtime opened.
	Claimed int
	// LastError is the last failure to fill the pool ("" when none, or the
	// last fill succeeded).
	LastError string
	// HeldBack says why the pool is not being filled although it is below
	// its size: a host cap (Options.MaxBoxes, Options.MaxMemoryMiB) or the
	// home's budget (Options.PoolMaxHomeBoxes) is reached ("" when not).
	// It is no failure: the pool fills again once there is room.
	HeldBack string
	// Evicted counts ready boxes removed to make room for a box started
	// past a cap (see docs/pool.md, "Caps").
	Evicted int
	// Boxes are the ids of the ready boxes, oldest first (List does not
	// show them).
	Boxes []string
}

// poolSet is a runtime's warm pools.
type poolSet struct {
	r      *Runtime
	pools  map[string]*pool // by key
	order  []*pool
	sem    chan struct{} // bounds concurrent fills across pools
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// homeLimit is Options.PoolMaxHomeBoxes (0: none).
	homeLimit int
	// roomMu serializes the cap checks (pool_caps.go) with the fill or
	// the start they allow.
	roomMu sync.Mutex

	mu   sync.Mutex
	warm map[string]any // claimed box id -> its Warm value, until taken
	from map[string]bool
	// launching and launchingMiB are the machines of this runtime that
	// passed the cap check and are being launched (the driver does not
	// count them yet), and their memory (pool_caps.go).
	launching, launchingMiB int
}

type pool struct {
	s    *poolSet
	key  string
	opts PoolOptions // BoxOptions with defaults
	kick chan struct{}

	mu       sync.Mutex
	ready    []pooledBox
	filling  int
	template string // snapshot name, "" when none
	booted   bool
	claimed  int
	claiming int // popped from ready, not yet the claimer's
	evicted  int
	lastErr  string
	heldBack string
	fails    int
	tmplMu   sync.Mutex // serializes template builds
	tmplBad  bool       // the driver cannot snapshot these boxes: boot them
	tmplSeen bool
}

type pooledBox struct {
	b    *Box
	warm any
	// restored: from the template snapshot (else booted).
	restored bool
}

// poolMarkKey carries the pool key a box is recorded under (recordBox).
type poolMarkKey struct{}

func withPoolMark(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, poolMarkKey{}, key)
}

func poolMark(ctx context.Context) string {
	k, _ := ctx.Value(poolMarkKey{}).(string)
	return k
}

// poolKey is the key of the pool that boxes of opts come from, and opts
// with defaults; ok is false when opts cannot come from a pool.
func poolKey(opts BoxOptions) (key string, o BoxOptions, ok bool) {
	if opts.FromSnapshot != "" || len(opts.Volumes) > 0 || len(opts.Ports) > 0 {
		return "", opts, false
	}
	o, err := withDefaults(opts)
	if err != nil {
		return "", opts, false
	}
	k := o
	k.Name, k.Hostname, k.AutoRemove = "", "", false
	k.TTL, k.IdleTimeout, k.Lease = 0, 0, 0 // the claimer's, from its claim
	if len(k.Env) == 0 {
		k.Env = nil
	}
	if len(k.AllowNet) == 0 {
		k.AllowNet = nil
	}
	if len(k.AllowHostPorts) == 0 {
		k.AllowHostPorts = nil
	}
	raw, _ := json.Marshal(k)
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:])[:16], o, true
}

// newPools checks opts.Pool and makes the runtime's pools (not started).
func newPools(r *Runtime, opts Options) (*poolSet, error) {
	if len(opts.Pool) == 0 {
		return nil, nil
	}
	fills := opts.PoolFills
	if fills <= 0 {
		fills = DefaultPoolFills
	}
	s := &poolSet{r: r, pools: map[string]*pool{}, sem: make(chan struct{}, fills), warm: map[string]any{}, from: map[string]bool{},
		homeLimit: max(opts.PoolMaxHomeBoxes, 0)}
	for i, po := range opts.Pool {
		if len(po.Volumes) > 0 || len(po.Ports) > 0 {
			return nil, fmt.Errorf("pool %d (%s): %w: pool boxes cannot have volumes or published ports; attach those to boxes created without a pool", i, po.Image, ErrInvalidArgument)
		}
		if po.Size < 1 || po.Size > MaxPoolSize {
			return nil, fmt.Errorf("pool %d (%s): %w: size %d: want 1..%d", i, po.Image, ErrInvalidArgument, po.Size, MaxPoolSize)
		}
		po.FromSnapshot = ""
		key, o, ok := poolKey(po.BoxOptions)
		if !ok {
			_, err := withDefaults(po.BoxOptions)
			return nil, fmt.Errorf("pool %d (%s): %w", i, po.Image, err)
		}
		if _, dup := s.pools[key]; dup {
			return nil, fmt.Errorf("pool %d (%s): %w: another pool has the same box options; give it a larger size instead", i, po.Image, ErrInvalidArgument)
		}
		o.Name, o.Hostname, o.AutoRemove = "", "", true
		po.BoxOptions = o
		p := &pool{s: s, key: key, opts: po, kick: make(chan struct{}, 1)}
		s.pools[key] = p
		s.order = append(s.order, p)
	}
	return s, nil
}

// start removes the template snapshots that crashed runtimes left and
// starts filling.
func (s *poolSet) start() {
	if s == nil {
		return
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.removeStaleTemplates()
	for _, p := range s.order {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			p.run()
		}()
	}
}

// templatePrefix starts the names of pool template snapshots:
// pool-KEY-PID-START, PID and START naming the runtime's process.
const templatePrefix = "pool-"

func (s *poolSet) removeStaleTemplates() {
	snaps, err := s.r.Snapshots(s.ctx)
	if err != nil {
		return
	}
	for _, sn := range snaps {
		f := strings.Split(strings.TrimPrefix(sn.Name, templatePrefix), "-")
		if !strings.HasPrefix(sn.Name, templatePrefix) || len(f) != 4 {
			continue
		}
		pid, err1 := strconv.Atoi(f[1])
		st, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if !(vmm.Handle{PID: pid, Start: st}).Alive() {
			s.r.RemoveSnapshot(s.ctx, sn.Name)
		}
	}
}

// stop ends the fills, waits for them, and removes the unclaimed boxes
// and the templates.
func (s *poolSet) stop() {
	if s == nil || s.cancel == nil {
		return
	}
	s.cancel()
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range s.order {
		p.mu.Lock()
		ready, tmpl := p.ready, p.template
		p.ready, p.template = nil, ""
		p.mu.Unlock()
		for _, pb := range ready {
			pb.b.remove(ctx, true)
		}
		if tmpl != "" {
			s.r.RemoveSnapshot(ctx, tmpl)
		}
	}
}

// run keeps the pool filled until the pool set stops.
func (p *pool) run() {
	ctx := p.s.ctx
	var fills sync.WaitGroup
	defer fills.Wait()
	for ctx.Err() == nil {
		p.mu.Lock()
		need := p.opts.Size - len(p.ready) - p.filling
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
			case <-time.After(backoff):
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
				// At a cap: no fill until there is room (pool_caps.go).
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
		case <-time.After(time.Second):
		}
	}
}

// fillOne adds one box to the pool.
func (p *pool) fillOne(ctx context.Context) {
	pb, err := p.make(ctx)
	p.mu.Lock()
	p.filling--
	var ce *CapacityError
	if errors.As(err, &ce) {
		// Another process took the room between the check and the
		// start: held back, not failed.
		p.heldBack = err.Error()
		p.mu.Unlock()
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			p.fails++
			p.lastErr = err.Error()
			if p.fails == 1 || p.fails%10 == 0 {
				p.s.r.warn(fmt.Sprintf("pool %s: cannot fill it (will retry): %v", p.opts.Image, err))
			}
		}
		p.mu.Unlock()
		return
	}
	p.fails, p.lastErr = 0, ""
	if ctx.Err() != nil {
		p.mu.Unlock()
		pb.b.remove(context.Background(), true)
		return
	}
	p.ready = append(p.ready, pb)
	p.mu.Unlock()
	p.s.recheck()
}

// recheck has every pool check the caps again now: a fill that ended
// counts as a running machine only, no longer as one in progress too.
// Until then a pool is not held back (WaitPools waits for the check).
func (s *poolSet) recheck() {
	for _, p := range s.order {
		p.mu.Lock()
		p.heldBack = ""
		p.mu.Unlock()
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// make restores (or boots) one box of the pool and warms it.
func (p *pool) make(ctx context.Context) (pooledBox, error) {
	mctx := withPoolMark(ctx, p.key)
	tmpl, err := p.templateName(ctx)
	if err != nil {
		return pooledBox{}, err
	}
	var b *Box
	if tmpl != "" {
		b, err = p.s.r.restore(mctx, BoxOptions{FromSnapshot: tmpl, AutoRemove: true})
		if err != nil {
			// A template removed or made stale (a new kernel, agent or
			// QEMU) is made again on the next fill.
			if ctx.Err() == nil {
				p.mu.Lock()
				if p.template == tmpl {
					p.template = ""
				}
				p.mu.Unlock()
				p.s.r.RemoveSnapshot(context.WithoutCancel(ctx), tmpl)
			}
			return pooledBox{}, err
		}
	} else {
		b, err = p.boot(mctx)
		if err != nil {
			return pooledBox{}, err
		}
	}
	var warm any
	if p.opts.Warm != nil {
		if warm, err = p.opts.Warm(ctx, b); err != nil {
			b.remove(context.WithoutCancel(ctx), true)
			return pooledBox{}, fmt.Errorf("warm pool box: %w", err)
		}
	}
	return pooledBox{b: b, warm: warm, restored: tmpl != ""}, nil
}

// boot creates a pool box by booting it, and runs Prepare in it.
func (p *pool) boot(ctx context.Context) (*Box, error) {
	b, err := p.s.r.create(ctx, p.opts.BoxOptions)
	if err != nil {
		return nil, err
	}
	if p.opts.Prepare != nil {
		if err := p.opts.Prepare(ctx, b); err != nil {
			b.remove(context.WithoutCancel(ctx), true)
			return nil, fmt.Errorf("prepare pool box: %w", err)
		}
	}
	return b, nil
}

// templateName returns the pool's template snapshot, making it if there
// is none; "" when the pool boots its boxes.
func (p *pool) templateName(ctx context.Context) (string, error) {
	p.tmplMu.Lock()
	defer p.tmplMu.Unlock()
	p.mu.Lock()
	tmpl, bad := p.template, p.tmplBad
	p.mu.Unlock()
	if tmpl != "" || bad {
		return tmpl, nil
	}
	if _, err := p.s.r.snapshotter(); err != nil {
		p.mu.Lock()
		p.tmplBad, p.booted = true, true
		p.mu.Unlock()
		return "", nil
	}
	b, err := p.boot(withPoolMark(ctx, p.key))
	if err != nil {
		return "", fmt.Errorf("template box: %w", err)
	}
	defer b.remove(context.WithoutCancel(ctx), true)
	pid := vmm.Handle{PID: os.Getpid()}
	name := fmt.Sprintf("%s%s-%d-%d-%s", templatePrefix, p.key[:8], pid.PID, vmm.StartTime(pid.PID), newID()[:6])
	if _, err := b.Snapshot(ctx, name); err != nil {
		if errors.Is(err, vmm.ErrNotSupported) {
			p.mu.Lock()
			p.tmplBad, p.booted = true, true
			p.mu.Unlock()
			return "", nil
		}
		return "", fmt.Errorf("template snapshot: %w", err)
	}
	p.mu.Lock()
	p.template = name
	p.mu.Unlock()
	return name, nil
}

// claim takes a ready box for opts from its pool and makes it the
// caller's; nil, nil when there is no pool for opts or none is ready.
func (s *poolSet) claim(ctx context.Context, opts BoxOptions) (*Box, error) {
	if s == nil {
		return nil, nil
	}
	key, _, ok := poolKey(opts)
	if !ok {
		return nil, nil
	}
	p := s.pools[key]
	if p == nil {
		return nil, nil
	}
	if opts.Name != "" {
		// Refused before a pool box is spent on it (a rename that loses
		// a race still is, below).
		if inUse, err := s.r.db.NameInUse(ctx, opts.Name); err != nil {
			return nil, err
		} else if inUse {
			return nil, fmt.Errorf("%w: %q (remove it, or pick another name)", ErrNameInUse, opts.Name)
		}
	}
	for {
		p.mu.Lock()
		if len(p.ready) == 0 {
			p.mu.Unlock()
			return nil, nil
		}
		pb := p.ready[0]
		p.ready = p.ready[1:]
		p.claimed++
		p.claiming++
		p.mu.Unlock()
		select {
		case p.kick <- struct{}{}:
		default:
		}
		err := s.personalise(ctx, pb, opts)
		p.mu.Lock()
		p.claiming--
		p.mu.Unlock()
		if err == nil {
			s.prune()
			s.mu.Lock()
			s.from[pb.b.id] = true
			if pb.warm != nil {
				s.warm[pb.b.id] = pb.warm
			}
			s.mu.Unlock()
			// Whether the pool may refill is known now, not only once its
			// fill loop has run again: a status read right after the claim
			// says so.
			p.checkRoom(ctx)
			return pb.b, nil
		}
		pb.b.remove(context.WithoutCancel(ctx), true)
		if errors.Is(err, ErrNameInUse) || ctx.Err() != nil {
			return nil, err
		}
		// A pool box that died or broke while it waited: try the next.
	}
}

// prune forgets the claimed boxes whose handles the runtime dropped
// (removed or closed), once there are many.
func (s *poolSet) prune() {
	s.mu.Lock()
	n := len(s.from)
	s.mu.Unlock()
	if n < 256 {
		return
	}
	s.r.mu.Lock()
	live := make(map[string]bool, len(s.r.boxes))
	for id := range s.r.boxes {
		live[id] = true
	}
	s.r.mu.Unlock()
	s.mu.Lock()
	for id := range s.from {
		if !live[id] {
			delete(s.from, id)
			delete(s.warm, id)
		}
	}
	s.mu.Unlock()
}

// personalise makes pool box pb the caller's box of opts: its name,
// hostname and AutoRemove, no pool mark; then the guest takes its
// hostname and, when restored from the template, fresh entropy and the
// host's time (as a restore does: it may have waited long in the pool).
func (s *poolSet) personalise(ctx context.Context, pb pooledBox, opts BoxOptions) error {
	b := pb.b
	_, cfg := b.snapshot()
	c := cfg
	c.Pool = ""
	c.Options.Name, c.Options.Hostname, c.Options.AutoRemove, c.Options.FromSnapshot = opts.Name, opts.Hostname, opts.AutoRemove, ""
	if !opts.AutoRemove {
		c.OwnerPID, c.OwnerStart = 0, 0
	}
	if opts.Name != "" {
		if err := b.Rename(ctx, opts.Name); err != nil {
			return err
		}
	}
	c.Options.TTL, c.Options.IdleTimeout, c.Options.Lease = opts.TTL, opts.IdleTimeout, opts.Lease
	c.startLife(time.Now())
	// A pool box is nobody's until now: its record is c, whole.
	if err := s.r.updateConfig(ctx, b.id, func(s *boxConfig) { *s = c }); err != nil {
		return fmt.Errorf("box %s: record it: %w", b.id, err)
	}
	if _, err := b.load(ctx); err != nil {
		return err
	}
	if pb.restored {
		return b.restored(ctx)
	}
	// A booted box has its own entropy and the right time; only its
	// hostname may change.
	if opts.Name == "" && opts.Hostname == "" {
		return nil
	}
	cl, err := b.client(ctx)
	if err != nil {
		return err
	}
	rec, cfg := b.snapshot()
	if _, err := cl.Restored(ctx, nil, 0, hostname(rec, cfg)); err != nil {
		return fmt.Errorf("box %s: set its hostname: %w", b.id, b.callErr(err))
	}
	return nil
}

// TakeWarm returns, once, what the pool's Warm hook made for this box
// when Create took it from a warm pool of this runtime; nil otherwise,
// and on later calls.
func (b *Box) TakeWarm() any {
	s := b.r.pool
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.warm[b.id]
	delete(s.warm, b.id)
	return w
}

// FromPool reports whether Create took this box from a warm pool of this
// runtime (Options.Pool) rather than booting or restoring it.
func (b *Box) FromPool() bool {
	s := b.r.pool
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.from[b.id]
}

// Pools returns the state of the runtime's warm pools (Options.Pool), in
// the order they were given.
func (r *Runtime) Pools() []PoolInfo {
	s := r.pool
	if s == nil {
		return nil
	}
	out := make([]PoolInfo, 0, len(s.order))
	for _, p := range s.order {
		p.mu.Lock()
		ids := make([]string, len(p.ready))
		for i, pb := range p.ready {
			ids[i] = pb.b.id
		}
		out = append(out, PoolInfo{Image: p.opts.Image, Key: p.key, Size: p.opts.Size, Ready: len(p.ready), Filling: p.filling,
			Template: p.template, Booted: p.booted, Claimed: p.claimed, LastError: p.lastErr,
			HeldBack: p.heldBack, Evicted: p.evicted, Boxes: ids})
		p.mu.Unlock()
	}
	return out
}

// WaitPools waits until every warm pool is full, or held back by a cap
// with no fill in progress (PoolInfo.HeldBack says which), or ctx ends
// (its error).
func (r *Runtime) WaitPools(ctx context.Context) error {
	for {
		full := true
		for _, p := range r.Pools() {
			full = full && (p.Ready >= p.Size || p.HeldBack != "" && p.Filling == 0)
		}
		if full {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the warm pools: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
