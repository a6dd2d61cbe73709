package airlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

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
	images := t.TempDir()
	s, err := image.Open(images)
	if err != nil {
		t.Fatal(err)
	}
	const ref = "test/fake:v1"
	if _, err := s.WriteImage(ctx, ref, imagetest.Image(t, []string{"sh"}), "test image", nil); err != nil {
		t.Fatal(err)
	}
	drv := fake.New(os.Getenv("AIRLOCK_AGENT"))
	home := t.TempDir()
	open := func(pools []airlock.PoolOptions) *airlock.Runtime {
		r, err := airlock.OpenWithDriver(airlock.Options{Home: home, ImagesDir: images, CacheDir: t.TempDir(),
			Warn: func(m string) { t.Log("warn: ", m) }, Pool: pools}, drv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	opts := airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone}
	var warmed sync.Map
	r := open([]airlock.PoolOptions{{BoxOptions: opts, Size: 3, Warm: func(ctx context.Context, b *airlock.Box) (any, error) {
		warmed.Store(b.ID(), true)
		return "warm-" + b.ID(), nil
	}}})
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
			if w := b.TakeWarm(); w != "warm-"+b.ID() {
				t.Errorf("TakeWarm = %v, want this box's warm value", w)
			}
			if w := b.TakeWarm(); w != nil {
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
	if _, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, Name: "mine"}); !errors.Is(err, airlock.ErrNameInUse) {
		t.Fatalf("claim with a name in use: %v, want ErrNameInUse", err)
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
