package airlock_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// TestPoolTemplateOnFake: a pool on a driver that can snapshot (the FAKE
// driver with snapshots) fills from a template snapshot instead of
// booting each box; claims get working boxes, each with a writable layer
// of its own; the pool refills; Close removes the unclaimed boxes and the
// template snapshot. (TestPoolFake covers a pool that boots its boxes.)
func TestPoolTemplateOnFake(t *testing.T) {
	ctx := context.Background()
	const ref = "test/fake:v1"
	images := fakeImageStore(t, ref)
	home := t.TempDir()
	opts := airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone}
	drv := fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT"))
	open := func(pools []airlock.PoolOptions) *airlock.Runtime {
		r, err := airlock.OpenWithDriver(airlock.Options{Home: home, ImagesDir: images, CacheDir: t.TempDir(),
			Warn: func(m string) { t.Log("warn: ", m) }, Pool: pools}, drv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	r := open([]airlock.PoolOptions{{BoxOptions: opts, Size: 2}})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.WaitPools(wctx); err != nil {
		t.Fatalf("%v: %+v", err, r.Pools())
	}
	if p := r.Pools()[0]; p.Template == "" || p.Booted || p.Ready != 2 {
		t.Fatalf("pool %+v: want 2 boxes restored from a template snapshot", p)
	}
	a, err := r.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !a.FromPool() {
		t.Fatal("the box did not come from the pool")
	}
	_, sha := fakeFiles(t, home, a)
	sha(`echo mine > "$F/mark"`)
	if err := a.Remove(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitPools(wctx); err != nil {
		t.Fatalf("refill: %v: %+v", err, r.Pools())
	}
	o := opts
	o.Name = "pooled-named"
	b, err := r.Create(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !b.FromPool() || b.Name() != "pooled-named" {
		t.Fatalf("named claim: from pool %v, name %q", b.FromPool(), b.Name())
	}
	_, shb := fakeFiles(t, home, b)
	if got := shb(`ls -A "$F"; echo end`); got != "end" {
		t.Errorf("a claimed box's writable layer: %q, want it empty", got)
	}
	if p := r.Pools()[0]; p.Claimed != 2 {
		t.Errorf("pool %+v: want 2 claimed", p)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if left := boxDirs(t, home); len(left) != 1 || left[0] != b.ID() {
		t.Errorf("box directories after Close: %v, want only the claimed box %s", left, b.ID())
	}
	snaps, _ := os.ReadDir(filepath.Join(home, "snapshots"))
	for _, s := range snaps {
		if !strings.HasPrefix(s.Name(), ".") {
			t.Errorf("snapshot %s left after Close", s.Name())
		}
	}
	if err := open(nil).Remove(ctx, b.ID(), true); err != nil {
		t.Error(err)
	}
}
