package airlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// TestPoolCaps: warm pools stay within the host caps and the home's
// budget (fake driver, its Usage scoped to this test's machines): a pool
// fills only up to the cap and says why it holds back; a box started
// past the cap takes the room of a ready pool box; a claim is counted
// once; with no pool box left to remove, the cap refuses as without
// pools; removing user boxes lets the pool refill up to the cap.
func TestPoolCaps(t *testing.T) {
	ctx := context.Background()
	const ref = "test/fake:v1"
	images := fakeImageStore(t, ref)
	type env struct {
		r   *airlock.Runtime
		drv *fake.Driver
	}
	open := func(t *testing.T, o airlock.Options) env {
		drv := fake.New(os.Getenv("AIRLOCK_AGENT"))
		drv.Scope = fmt.Sprintf("poolcaps-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
		o.Home, o.ImagesDir, o.CacheDir = t.TempDir(), images, t.TempDir()
		o.Warn = func(m string) { t.Log("warn: ", m) }
		r, err := airlock.OpenWithDriver(o, drv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return env{r, drv}
	}
	wait := func(t *testing.T, r *airlock.Runtime) airlock.PoolInfo {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := r.WaitPools(wctx); err != nil {
			t.Fatalf("%v: %+v", err, r.Pools())
		}
		return r.Pools()[0]
	}
	// settled waits for the pool to settle: no fill in progress, and
	// either full or held back. Right after a fill ends the pool is
	// neither for a moment (its fill loop checks the caps again: see
	// Set.recheck in internal/pool), so a status read then says nothing
	// yet.
	settled := func(t *testing.T, r *airlock.Runtime) airlock.PoolInfo {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			p := r.Pools()[0]
			if p.Filling == 0 && (p.Ready >= p.Size || p.HeldBack != "") {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool %+v did not settle (full, or held back with no fill in progress)", p)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// waitReady waits for the pool to settle with n ready boxes
	// (WaitPools returns at once while it is held back).
	waitReady := func(t *testing.T, r *airlock.Runtime, n int) airlock.PoolInfo {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			p := settled(t, r)
			if p.Ready == n {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool %+v, want %d ready", p, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	machines := func(e env) int { return e.drv.Usage("").Machines }
	// AutoRemove: the user boxes go with the runtime's Close.
	pooled := airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, AutoRemove: true}
	other := airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, MemoryMiB: 256, AutoRemove: true}
	create := func(t *testing.T, r *airlock.Runtime, o airlock.BoxOptions) *airlock.Box {
		t.Helper()
		b, err := r.Create(ctx, o)
		if err != nil {
			t.Fatalf("create: %v (pools %+v)", err, r.Pools())
		}
		return b
	}

	t.Run("MaxBoxes", func(t *testing.T) {
		e := open(t, airlock.Options{MaxBoxes: 3, Pool: []airlock.PoolOptions{{BoxOptions: pooled, Size: 4}}})
		// WaitPools returns once the pool is held back, which it is while
		// its third box still starts (a start holds its place at the cap).
		wait(t, e.r)
		p := waitReady(t, e.r, 3)
		if p.Ready != 3 || !strings.Contains(p.HeldBack, "MaxBoxes") || len(p.Boxes) != 3 {
			t.Fatalf("pool of 4 under a cap of 3 boxes: %+v, want 3 ready and held back by MaxBoxes", p)
		}
		if n := machines(e); n != 3 {
			t.Fatalf("%d machines run, want 3", n)
		}
		// Operators see pool boxes (List does not show them): PoolBoxes,
		// and an image removal refused for them names them as such.
		pbs, err := e.r.PoolBoxes(ctx)
		if err != nil || len(pbs) != 3 || pbs[0].OwnerPID != os.Getpid() || pbs[0].State != "running" {
			t.Fatalf("PoolBoxes: %+v %v, want the 3 running pool boxes of this process", pbs, err)
		}
		_, err = e.r.RemoveImage(ctx, ref, false)
		var iu *airlock.ImageInUseError
		if !errors.As(err, &iu) || len(iu.PoolBoxes) != 3 || !strings.Contains(err.Error(), "warm-pool boxes") || !strings.Contains(err.Error(), pbs[2].ID) {
			t.Fatalf("removing the pool's image: %v, want a refusal naming the 3 pool boxes", err)
		}
		// A box of other options takes the room of a pool box.
		cold := create(t, e.r, other)
		if cold.FromPool() {
			t.Fatal("a box of other options came from the pool")
		}
		if p := e.r.Pools()[0]; p.Ready != 2 || p.Evicted != 1 {
			t.Fatalf("after a start at the cap: %+v, want 2 ready, 1 evicted", p)
		}
		// A claim is one box before and after: the pool does not refill
		// past the cap (it checks every second).
		claimed := create(t, e.r, pooled)
		if !claimed.FromPool() {
			t.Fatal("the claim did not come from the pool")
		}
		time.Sleep(1500 * time.Millisecond) // a refill past the cap would start by now
		if p := settled(t, e.r); p.Ready != 1 || p.Filling != 0 || p.Evicted != 1 || p.HeldBack == "" {
			t.Fatalf("after a claim at the cap: %+v, want 1 ready, none filling, held back", p)
		}
		if n := machines(e); n != 3 {
			t.Fatalf("%d machines run at a cap of 3", n)
		}
		cold2 := create(t, e.r, other)
		if p := e.r.Pools()[0]; p.Ready != 0 || p.Evicted != 2 {
			t.Fatalf("after the last pool box made room: %+v", p)
		}
		// Nothing left to take the room of: refused as without pools.
		_, err = e.r.Create(ctx, other)
		var ce *airlock.CapacityError
		if !errors.As(err, &ce) || ce.Cap != "AIRLOCK_MAX_BOXES" {
			t.Fatalf("a 4th box at a cap of 3 with no pool box left: %v, want a CapacityError", err)
		}
		if n := machines(e); n != 3 {
			t.Fatalf("%d machines run at a cap of 3", n)
		}
		// Room again: the pool refills up to the cap, not past it.
		for _, b := range []*airlock.Box{cold, cold2} {
			if err := b.Remove(ctx, true); err != nil {
				t.Fatal(err)
			}
		}
		waitReady(t, e.r, 2)
		time.Sleep(1500 * time.Millisecond) // a refill past the cap would start by now
		if p = settled(t, e.r); p.Ready != 2 || p.HeldBack == "" {
			t.Fatalf("refill with room for 2: %+v", p)
		}
		if n := machines(e); n != 3 {
			t.Fatalf("%d machines run at a cap of 3", n)
		}
	})

	t.Run("concurrent starts at the cap", func(t *testing.T) {
		// Five boxes started at once against a full pool at a cap of 3:
		// three take the pool boxes' room, two are refused, and no more
		// than 3 machines ever run.
		e := open(t, airlock.Options{MaxBoxes: 3, Pool: []airlock.PoolOptions{{BoxOptions: pooled, Size: 3}}})
		// All three ready (WaitPools also returns while a fill is held
		// back, as the third is while the template's machine still
		// counts against the cap).
		waitReady(t, e.r, 3)
		stop := make(chan struct{})
		peak := make(chan int)
		go func() {
			m := 0
			for {
				select {
				case <-stop:
					peak <- m
					return
				default:
				}
				m = max(m, machines(e))
				time.Sleep(2 * time.Millisecond)
			}
		}()
		const n = 5
		errs := make(chan error, n)
		for range n {
			go func() {
				_, err := e.r.Create(ctx, other)
				errs <- err
			}()
		}
		ok, refused := 0, 0
		for range n {
			var ce *airlock.CapacityError
			switch err := <-errs; {
			case err == nil:
				ok++
			case errors.As(err, &ce):
				refused++
			default:
				t.Error(err)
			}
		}
		close(stop)
		if m := <-peak; m > 3 || ok != 3 || refused != 2 {
			t.Fatalf("5 concurrent starts at a cap of 3 with 3 pool boxes: %d started, %d refused, peak %d machines; want 3, 2, at most 3 (pools %+v)",
				ok, refused, m, e.r.Pools())
		}
		if p := e.r.Pools()[0]; p.Evicted != 3 || p.Ready != 0 {
			t.Fatalf("pool after: %+v, want all 3 evicted", p)
		}
	})

	t.Run("MaxMemoryMiB", func(t *testing.T) {
		// Each box counts with its memory and the per-box overhead (ov):
		// the cap fits two pool boxes and a small box, not three pool
		// boxes nor two small boxes more.
		ov := airlock.BoxOverheadMiB
		limit := 700 + 3*ov
		big := pooled
		big.MemoryMiB = 256
		e := open(t, airlock.Options{MaxMemoryMiB: limit, Pool: []airlock.PoolOptions{{BoxOptions: big, Size: 4}}})
		wait(t, e.r)
		p := waitReady(t, e.r, 2)
		if p.Ready != 2 || !strings.Contains(p.HeldBack, "MaxMemoryMiB") {
			t.Fatalf("pool of 4 × 256 MiB under a cap of %d MiB: %+v, want 2 ready, held back by MaxMemoryMiB", limit, p)
		}
		small := other
		small.MemoryMiB = 128
		create(t, e.r, small) // 640 MiB + 3 overheads: fits, nothing removed
		if p := e.r.Pools()[0]; p.Ready != 2 || p.Evicted != 0 {
			t.Fatalf("a box that fits removed a pool box: %+v", p)
		}
		create(t, e.r, small) // 768 MiB + 4 overheads: one pool box makes room
		if p := e.r.Pools()[0]; p.Ready != 1 || p.Evicted != 1 {
			t.Fatalf("a box past the memory cap: %+v, want 1 ready, 1 evicted", p)
		}
		if u := e.drv.Usage(""); u.MemoryMiB+u.Machines*ov > limit {
			t.Fatalf("running boxes take %d MiB (%d boxes) at a cap of %d", u.MemoryMiB+u.Machines*ov, u.Machines, limit)
		}
	})

	t.Run("PoolMaxHomeBoxes", func(t *testing.T) {
		e := open(t, airlock.Options{PoolMaxHomeBoxes: 2, Pool: []airlock.PoolOptions{{BoxOptions: pooled, Size: 3}}})
		wait(t, e.r)
		p := waitReady(t, e.r, 2)
		if p.Ready != 2 || !strings.Contains(p.HeldBack, "--max-boxes") {
			t.Fatalf("pool of 3 within a home budget of 2: %+v", p)
		}
		cold := create(t, e.r, other)
		if p := e.r.Pools()[0]; p.Ready != 1 || p.Evicted != 1 {
			t.Fatalf("a box past the home's budget: %+v, want 1 ready, 1 evicted", p)
		}
		create(t, e.r, pooled)
		time.Sleep(1500 * time.Millisecond) // a refill past the budget would start by now
		if p := settled(t, e.r); p.Ready != 0 || p.Filling != 0 {
			t.Fatalf("after a claim at the home's budget: %+v, want the pool empty", p)
		}
		if err := cold.Remove(ctx, true); err != nil {
			t.Fatal(err)
		}
		waitReady(t, e.r, 1)
		time.Sleep(1500 * time.Millisecond) // a refill past the budget would start by now
		if p := settled(t, e.r); p.Ready != 1 || p.HeldBack == "" {
			t.Fatalf("refill with room for 1: %+v", p)
		}
		if l, _ := e.r.List(ctx); len(l) != 1 {
			t.Fatalf("List: %d boxes, want the claimed one", len(l))
		}
	})
}
