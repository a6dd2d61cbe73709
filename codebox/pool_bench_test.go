package codebox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// idleCPU is the share of a host CPU that the QEMUs of home use, per
// QEMU, over 3 s.
func idleCPU(b *testing.B, home string) float64 {
	ticks := func() (int64, int) {
		var sum int64
		n := 0
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			c, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil || !strings.Contains(string(c), home) || !strings.Contains(string(c), "qemu-system") {
				continue
			}
			st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if err != nil {
				continue
			}
			f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			sum += u + s
			n++
		}
		return sum, n
	}
	t0, n := ticks()
	if n == 0 {
		// A confined QEMU (internal/vmm/qemu jail) may not name the home
		// in its command line.
		b.Log("no QEMU of the pool found by its command line: idle CPU not measured")
		return -1
	}
	time.Sleep(3 * time.Second)
	t1, _ := ticks()
	return float64(t1-t0) / 100 / 3 / float64(n) // USER_HZ 100
}

// BenchmarkPool measures, in one run (use -benchtime=1x), medians of
// seven: a CodeBox cold (codebox.New booting a box → NewContext → the
// first Run("x = 1\nx + 1") result) against one from a warm pool
// (codebox.Pool; the pool refilled between runs, untimed); target pool
// ≤ 0.05× cold. It also reports New → first CodeBox.Run("print(1)")
// (a python -c, an interpreter start either way) for both.
//
// go test -run '^$' -bench BenchmarkPool -benchtime=1x ./codebox
func BenchmarkPool(b *testing.B) {
	vmtest.Require(b)
	ctx := context.Background()
	open := func(pools []airlock.PoolOptions) *airlock.Runtime {
		r, err := airlock.Open(airlock.Options{Home: b.TempDir(), ImagesDir: vmtest.ImagesDir(), AgentPath: agentPath,
			Warn: func(string) {}, Pool: pools})
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	median := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	// first returns New → first context result, New → first Run, and
	// (pooled) the claim → the pool full again (one box restored and
	// warmed: its fill time).
	first := func(r *airlock.Runtime, pooled bool) (time.Duration, time.Duration, time.Duration) {
		if pooled {
			wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			defer cancel()
			if err := r.WaitPools(wctx); err != nil {
				b.Fatal(err)
			}
		}
		t0 := time.Now()
		cb, err := codebox.New(ctx, r, codebox.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer cb.Close()
		if cb.Box().FromPool() != pooled {
			b.Fatalf("from pool %v, want %v", cb.Box().FromPool(), pooled)
		}
		x, err := cb.NewContext(ctx)
		if err != nil {
			b.Fatal(err)
		}
		res, err := x.Run(ctx, "x = 1\nx + 1")
		if err != nil || res.Value != "2" {
			b.Fatalf("%+v %v", res, err)
		}
		dctx := time.Since(t0)
		var refill time.Duration
		if pooled {
			if err := r.WaitPools(ctx); err != nil {
				b.Fatal(err)
			}
			refill = time.Since(t0)
		}
		t0 = time.Now()
		cb2, err := codebox.New(ctx, r, codebox.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer cb2.Close()
		if out, err := cb2.Run(ctx, "print(1)"); err != nil || out != "1\n" {
			b.Fatalf("%q %v", out, err)
		}
		return dctx, time.Since(t0), refill
	}
	const runs = 7
	for i := 0; i < b.N; i++ {
		cold, warm := open(nil), open([]airlock.PoolOptions{codebox.Pool(codebox.Options{}, 1)})
		var cCtx, cRun, wCtx, wRun, fill []time.Duration
		for j := 0; j < runs; j++ {
			// Alternate, so that drift of this shared machine hits both.
			a, c, _ := first(cold, false)
			cCtx, cRun = append(cCtx, a), append(cRun, c)
			a, c, f := first(warm, true)
			wCtx, wRun, fill = append(wCtx, a), append(wRun, c), append(fill, f)
		}
		if err := warm.WaitPools(ctx); err != nil {
			b.Fatal(err)
		}
		time.Sleep(time.Second) // the last fill's exec settles
		idle := idleCPU(b, warm.Home())
		cold.Close()
		warm.Close()
		mc, mw := median(cCtx), median(wCtx)
		rc, rw := median(cRun), median(wRun)
		fmt.Printf("codebox cold: New → first context Run(\"x + 1\") %s; from the pool %s: %.3f× (target ≤ 0.05×)\n",
			mc.Round(time.Millisecond), mw.Round(100*time.Microsecond), float64(mw)/float64(mc))
		fmt.Printf("codebox cold: New → first Run(\"print(1)\") (python -c) %s; from the pool %s: %.3f×\n",
			rc.Round(time.Millisecond), rw.Round(time.Millisecond), float64(rw)/float64(rc))
		fmt.Printf("refill of one pool box (claim → pool full again): %s\n", median(fill).Round(time.Millisecond))
		if idle >= 0 {
			fmt.Printf("an idle pool box's QEMU uses %.1f%% of a host CPU\n", idle*100)
		}
		b.ReportMetric(float64(mc.Microseconds())/1000, "cold-ms")
		b.ReportMetric(float64(mw.Microseconds())/1000, "pool-ms")
		b.ReportMetric(float64(mw)/float64(mc), "pool/cold")
		b.ReportMetric(float64(median(fill).Microseconds())/1000, "refill-ms")
	}
}
