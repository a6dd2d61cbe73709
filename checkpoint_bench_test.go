package airlock_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// BenchmarkCheckpoint measures, on one 512 MiB box with 10 MiB written
// between steps (medians of 5, alternating so that a drifting shared host
// moves both alike):
//
//   - Checkpoint against Snapshot of the same box: wall time, time paused
//     and bytes on disk;
//   - Rollback (to the first `exec true` answered) against a restore
//     (Create with FromSnapshot → first `exec true`).
//
// Issue #37's targets: checkpoint ≤ 0.25× a snapshot's time and ≤ 0.1× its
// disk; rollback ≤ 1.2× a restore.
//
// go test -run '^$' -bench BenchmarkCheckpoint -benchtime=1x .
func BenchmarkCheckpoint(b *testing.B) {
	vmtest.Require(b)
	ctx := context.Background()
	r, err := airlock.Open(airlock.Options{Home: b.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	median := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	box, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage, MemoryMiB: 512, Network: airlock.NetworkNone})
	if err != nil {
		b.Fatal(err)
	}
	defer box.Remove(context.Background(), true)
	step := 0
	dirty := func() {
		step++
		script := fmt.Sprintf("head -c 10M /dev/urandom > /root/d%d", step)
		if res, err := box.Exec(ctx, "sh", []string{"-c", script}, airlock.ExecOptions{}); err != nil || res.ExitCode != 0 {
			b.Fatalf("dirty: %+v %v", res, err)
		}
	}
	firstExec := func(bx *airlock.Box) {
		if res, err := bx.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %+v %v", res, err)
		}
	}
	const runs = 5
	for i := 0; i < b.N; i++ {
		var snapT, ckptT, snapP, ckptP, rollT, restT, rollX, restX []time.Duration
		var snapB, ckptB []int64
		for j := range runs {
			dirty()
			t0 := time.Now()
			s, err := box.Snapshot(ctx, fmt.Sprintf("s%d-%d", i, j))
			if err != nil {
				b.Fatal(err)
			}
			snapT, snapP, snapB = append(snapT, time.Since(t0)), append(snapP, s.Paused), append(snapB, s.StateBytes+s.DiskBytes)
			dirty()
			t0 = time.Now()
			c, err := box.Checkpoint(ctx, fmt.Sprintf("c%d-%d", i, j))
			if err != nil {
				b.Fatal(err)
			}
			ckptT, ckptP, ckptB = append(ckptT, time.Since(t0)), append(ckptP, c.Paused), append(ckptB, c.StateBytes+c.DiskBytes)
			dirty()
			t0 = time.Now()
			if err := box.Rollback(ctx, c.Name); err != nil {
				b.Fatal(err)
			}
			tx := time.Now()
			firstExec(box)
			rollT, rollX = append(rollT, time.Since(t0)), append(rollX, time.Since(tx))
			t0 = time.Now()
			rb, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: s.Name})
			if err != nil {
				b.Fatal(err)
			}
			tx = time.Now()
			firstExec(rb)
			restT, restX = append(restT, time.Since(t0)), append(restX, time.Since(tx))
			rb.Remove(ctx, true)
			r.RemoveSnapshot(ctx, s.Name)
		}
		mb := func(v []int64) float64 {
			sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
			return float64(v[len(v)/2]) / (1 << 20)
		}
		st, ct, rt, rs := median(snapT), median(ckptT), median(rollT), median(restT)
		b.Logf("snapshot %v (paused %v, %.1f MiB); checkpoint %v (paused %v, %.1f MiB): %.2fx time, %.2fx disk",
			st.Round(time.Millisecond), median(snapP).Round(time.Millisecond), mb(snapB),
			ct.Round(time.Millisecond), median(ckptP).Round(time.Millisecond), mb(ckptB), float64(ct)/float64(st), mb(ckptB)/mb(snapB))
		b.Logf("rollback to first exec %v (the exec %v); restore to first exec %v (the exec %v): %.2fx", rt.Round(time.Millisecond),
			median(rollX).Round(time.Millisecond), rs.Round(time.Millisecond), median(restX).Round(time.Millisecond), float64(rt)/float64(rs))
		b.ReportMetric(float64(ct)/float64(st), "ckpt/snap-time")
		b.ReportMetric(float64(rt)/float64(rs), "rollback/restore")
	}
}
