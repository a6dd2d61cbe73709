package airlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/friend"
	"github.com/airlock-run/airlock/internal/vmm/fake"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// idObserver records the box ids of the events it gets.
type idObserver struct {
	mu  sync.Mutex
	ids map[string]int
}

func (o *idObserver) add(id string) {
	o.mu.Lock()
	if o.ids == nil {
		o.ids = map[string]int{}
	}
	o.ids[id]++
	o.mu.Unlock()
}

func (o *idObserver) seen(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ids[id] > 0
}

func (o *idObserver) BoxStarted(e airlock.BoxStartEvent) { o.add(e.BoxID) }
func (o *idObserver) ExecEnded(e airlock.ExecEvent)      { o.add(e.BoxID) }
func (o *idObserver) BoxDied(e airlock.BoxDiedEvent)     { o.add(e.BoxID) }
func (o *idObserver) ImagePulled(airlock.ImagePullEvent) {}

// boxDirs lists the box directories under home (pool boxes included).
func boxDirs(t *testing.T, home string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(home, "boxes"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestPoolFake: the pool logic on the fake driver (it cannot snapshot, so
// pool boxes are booted): a pool fills; its boxes are not listed and Get
// does not find them, in this runtime or another on the same home;
// concurrent Creates never get the same box; the pool refills; a claim
// takes the caller's name; Warm's value is handed over once; Close
// removes the unclaimed boxes.
func TestPoolFake(t *testing.T) {
	ctx := context.Background()
	const ref = "test/fake:v1"
	images := fakeImageStore(t, ref)
	drv := fake.New(os.Getenv("AIRLOCK_AGENT"))
	home := t.TempDir()
	obs := &idObserver{}
	open := func(pools []airlock.PoolOptions) *airlock.Runtime {
		r, err := airlock.OpenWithDriver(airlock.Options{Home: home, ImagesDir: images, CacheDir: t.TempDir(),
			Warn: func(m string) { t.Log("warn: ", m) }, Pool: pools, Observer: obs}, drv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	opts := airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone}
	var warmed sync.Map
	po := airlock.PoolOptions{BoxOptions: opts, Size: 3}
	friend.PoolWarm(&po, func(ctx context.Context, box any) (any, error) {
		b := box.(*airlock.Box)
		warmed.Store(b.ID(), true)
		// An exec while pooled: not an event.
		if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil {
			return nil, err
		}
		return "warm-" + b.ID(), nil
	})
	r := open([]airlock.PoolOptions{po})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.WaitPools(wctx); err != nil {
		t.Fatalf("%v: %+v", err, r.Pools())
	}
	if p := r.Pools()[0]; p.Ready != 3 || !p.Booted || p.Template != "" {
		t.Fatalf("pool: %+v, want 3 ready, booted (the fake driver cannot snapshot)", p)
	}
	if l, _ := r.List(ctx); len(l) != 0 {
		t.Fatalf("List shows pool boxes: %+v", l)
	}
	other := open(nil)
	pooled := boxDirs(t, home)
	if len(pooled) != 3 {
		t.Fatalf("box dirs %v, want the 3 pool boxes", pooled)
	}
	for _, id := range pooled {
		if obs.seen(id) {
			t.Errorf("the observer heard of pool box %s before it was claimed", id)
		}
		for _, rt := range []*airlock.Runtime{r, other} {
			if _, err := rt.Get(ctx, id); !errors.Is(err, airlock.ErrBoxNotFound) {
				t.Fatalf("Get(pool box %s) = %v, want ErrBoxNotFound", id, err)
			}
		}
	}
	if l, _ := other.List(ctx); len(l) != 0 {
		t.Fatalf("another runtime lists pool boxes: %+v", l)
	}

	// Concurrent claims: never the same box twice.
	const n = 6
	boxes := make([]*airlock.Box, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range boxes {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			boxes[i], errs[i] = r.Create(ctx, opts)
		}(i)
	}
	wg.Wait()
	seen := map[string]bool{}
	fromPool := 0
	for i, b := range boxes {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if seen[b.ID()] {
			t.Fatalf("box %s handed out twice", b.ID())
		}
		seen[b.ID()] = true
		if b.FromPool() {
			fromPool++
			if _, ok := warmed.Load(b.ID()); !ok {
				t.Errorf("pool box %s was not warmed", b.ID())
			}
			if w := friend.TakeWarm(b); w != "warm-"+b.ID() {
				t.Errorf("TakeWarm = %v, want this box's warm value", w)
			}
			if w := friend.TakeWarm(b); w != nil {
				t.Errorf("second TakeWarm = %v, want nil", w)
			}
		}
		if res, err := b.Exec(ctx, "echo", []string{"hi"}, airlock.ExecOptions{}); err != nil || string(res.Stdout) != "hi\n" {
			t.Fatalf("exec in claimed box: %+v %v", res, err)
		}
	}
	if fromPool < 3 {
		t.Fatalf("%d of %d boxes came from the pool of 3, want at least 3", fromPool, n)
	}
	if l, _ := r.List(ctx); len(l) != n {
		t.Fatalf("List: %d boxes, want the %d claimed", len(l), n)
	}
	// Refill.
	if err := r.WaitPools(wctx); err != nil {
		t.Fatalf("refill: %v: %+v", err, r.Pools())
	}
	if p := r.Pools()[0]; p.Claimed != fromPool {
		t.Errorf("pool says %d claimed, %d boxes came from it", p.Claimed, fromPool)
	}
	// A named claim, and options that match no pool.
	named, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, Name: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	if !named.FromPool() || named.Name() != "mine" {
		t.Fatalf("named claim: from pool %v, name %q", named.FromPool(), named.Name())
	}
	if g, err := other.Get(ctx, "mine"); err != nil || g.ID() != named.ID() {
		t.Fatalf("Get(mine) from another runtime: %v", err)
	}
	claimed := r.Pools()[0].Claimed
	if _, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, Name: "mine"}); !errors.Is(err, airlock.ErrNameInUse) {
		t.Fatalf("claim with a name in use: %v, want ErrNameInUse", err)
	}
	if p := r.Pools()[0]; p.Claimed != claimed {
		t.Errorf("a claim refused for its name spent a pool box: claimed %d, was %d", p.Claimed, claimed)
	}
	cold, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if cold.FromPool() {
		t.Fatal("a box of other options came from the pool")
	}
	if err := r.WaitPools(wctx); err != nil {
		t.Fatal(err)
	}

	// Close removes the unclaimed boxes, and only those.
	users := map[string]bool{named.ID(): true, cold.ID(): true}
	for _, b := range boxes {
		users[b.ID()] = true
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	left := boxDirs(t, home)
	for _, id := range left {
		if !users[id] {
			t.Errorf("box %s left after Close: an unclaimed pool box", id)
		}
	}
	if len(left) != len(users) {
		t.Errorf("after Close %d boxes, want the %d claimed", len(left), len(users))
	}
	for id := range users {
		if err := other.Remove(ctx, id, true); err != nil {
			t.Error(err)
		}
	}
}

// qemuWithHome lists the pids of processes whose command line names home
// (the QEMUs and network helpers of its boxes).
func procsWithHome(t *testing.T, home string) []string {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), home) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// TestPoolQEMU: a pool of real VMs restored from its template snapshot:
// two concurrent claims get two working boxes, each with its own id,
// hostname and RNG output; a claimed box has nothing another pool box's
// user wrote; a claim takes the caller's name as hostname; the pool
// refills; Close leaves no QEMU running and removes the template.
func TestPoolQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	home := t.TempDir()
	opts := airlock.BoxOptions{Image: vmtest.DefaultImage, AutoRemove: true}
	r, err := airlock.Open(airlock.Options{Home: home, ImagesDir: vmtest.ImagesDir(), Warn: func(m string) { t.Log("warn: ", m) },
		Pool: []airlock.PoolOptions{{BoxOptions: opts, Size: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	if err := r.WaitPools(wctx); err != nil {
		t.Fatalf("%v: %+v", err, r.Pools())
	}
	p := r.Pools()[0]
	t.Logf("pool of 2 filled in %s: %+v", time.Since(t0), p)
	if p.Template == "" || p.Booted {
		t.Fatalf("pool %+v: want boxes restored from a template snapshot", p)
	}
	var boxes [2]*airlock.Box
	var errs [2]error
	var claimT [2]time.Duration
	var wg sync.WaitGroup
	for i := range boxes {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			t0 := time.Now()
			boxes[i], errs[i] = r.Create(ctx, opts)
			claimT[i] = time.Since(t0)
		}(i)
	}
	wg.Wait()
	for i, b := range boxes {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if !b.FromPool() {
			t.Fatalf("box %d did not come from the pool", i)
		}
	}
	t.Logf("claims took %s and %s", claimT[0], claimT[1])
	a, b := boxes[0], boxes[1]
	if a.ID() == b.ID() {
		t.Fatal("one pool box claimed twice")
	}
	ra := shIn(t, a, "hostname; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; ls -A /root /tmp | tr '\\n' ' '")
	rb := shIn(t, b, "hostname; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
	la, lb := strings.Split(ra, "\n"), strings.Split(rb, "\n")
	if la[0] != a.ID() || lb[0] != b.ID() {
		t.Errorf("hostnames %q and %q, want the boxes' ids %s and %s", la[0], lb[0], a.ID(), b.ID())
	}
	if la[1] == lb[1] {
		t.Errorf("two claimed boxes read the same /dev/urandom bytes %s", la[1])
	}
	// The template was booted and snapshotted, nothing else: /root has
	// the image's files only, /tmp nothing.
	if la[2] != "/root: .bashrc .profile  /tmp:" {
		t.Errorf("a claimed box's /root and /tmp: %q, want the image's files only", la[2])
	}
	// The clock was stepped to the host's at the claim.
	if g, err := strconv.ParseFloat(shIn(t, b, "date +%s.%N"), 64); err != nil {
		t.Error(err)
	} else if d := float64(time.Now().UnixNano())/1e9 - g; d > 1 || d < -1 {
		t.Errorf("a claimed box's clock is %.3f s off the host's", d)
	}
	shIn(t, a, "echo mine > /root/mark")
	a.Remove(ctx, true)
	// Refill, then a named claim: none of a's files, its own hostname.
	if err := r.WaitPools(wctx); err != nil {
		t.Fatalf("refill: %v: %+v", err, r.Pools())
	}
	if p := r.Pools()[0]; p.Claimed != 2 || p.Ready != 2 {
		t.Errorf("after refill: %+v, want 2 claimed, 2 ready", p)
	}
	o := opts
	o.Name = "pooled-named"
	c, err := r.Create(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !c.FromPool() {
		t.Fatal("named box did not come from the pool")
	}
	if got := shIn(t, c, "hostname; [ -e /root/mark ] && echo LEAK || echo clean"); got != "pooled-named\nclean" {
		t.Errorf("named claimed box: %q, want its name as hostname and no file of another box", got)
	}
	if l, _ := r.List(ctx); len(l) != 2 {
		t.Errorf("List: %d boxes, want the 2 claimed ones left (pool boxes hidden)", len(l))
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if left := procsWithHome(t, home); len(left) > 0 {
		t.Errorf("processes left after Close: %v", left)
	}
	if snaps, _ := os.ReadDir(filepath.Join(home, "snapshots")); len(snaps) > 0 {
		var names []string
		for _, s := range snaps {
			if !strings.HasPrefix(s.Name(), ".") {
				names = append(names, s.Name())
			}
		}
		if len(names) > 0 {
			t.Errorf("snapshots left after Close: %v", names)
		}
	}
}
