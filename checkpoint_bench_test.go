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
// between steps (medians of 5, the two orders alternating so that a
// drifting shared host and the previous step's writeback weigh on both
// alike):
//
//   - Checkpoint (its parent the box's previous checkpoint, so only what
//     changed is stored) against Snapshot of the same box: wall time,
//     time paused and bytes on disk;
//   - Rollback (to the first `exec true` answered) against a restore
//     (Create with FromSnapshot → first `exec true`).
//
// Sub-benchmarks: "fresh" (a python:slim box as it boots, ~60 MiB of RAM
// in use) and "heap256" (a Python process holding 256 MiB besides).
// Issue #37's targets: checkpoint ≤ 0.25× a snapshot's time and ≤ 0.1× its
// disk; rollback ≤ 1.2× a restore.
//
// go test -run '^$' -bench BenchmarkCheckpoint -benchtime=1x .
func BenchmarkCheckpoint(b *testing.B) {
	vmtest.Require(b)
	for _, heap := range []int{0, 256} {
		name := "fresh"
		if heap > 0 {
			name = fmt.Sprintf("heap%d", heap)
		}
		b.Run(name, func(b *testing.B) { benchCheckpoint(b, heap) })
	}
}

func benchCheckpoint(b *testing.B, heapMiB int) {
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
	sh := func(script string) {
		if res, err := box.Exec(ctx, "sh", []string{"-c", script}, airlock.ExecOptions{Timeout: 5 * time.Minute}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%s: %+v %v", script, res, err)
		}
	}
	if heapMiB > 0 {
		sh(fmt.Sprintf(`setsid python3 -c 'import time; x = b"\x5a" * (%d << 20); open("/root/heap", "w").write("1"); time.sleep(1e6)' </dev/null >/dev/null 2>&1 &
while [ ! -s /root/heap ]; do sleep 0.1; done`, heapMiB))
	}
	step := 0
	dirty := func() {
		step++
		sh(fmt.Sprintf("head -c 10M /dev/urandom > /root/d%d", step))
	}
	firstExec := func(bx *airlock.Box) {
		if res, err := bx.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %+v %v", res, err)
		}
	}
	// The first checkpoint is whole: the measured ones are the box's
	// next ones.
	if _, err := box.Checkpoint(ctx, "base"); err != nil {
		b.Fatal(err)
	}
	const runs = 5
	for i := 0; i < b.N; i++ {
		var snapT, ckptT, snapP, ckptP, rollT, restT, rollX, restX []time.Duration
		var snapB, ckptB []int64
		for j := range runs {
			var s airlock.SnapshotInfo
			var c airlock.CheckpointInfo
			snap := func() {
				dirty()
				t0 := time.Now()
				var err error
				if s, err = box.Snapshot(ctx, fmt.Sprintf("s%d-%d", i, j)); err != nil {
					b.Fatal(err)
				}
				snapT, snapP, snapB = append(snapT, time.Since(t0)), append(snapP, s.Paused), append(snapB, s.StateBytes+s.DiskBytes)
			}
			ckpt := func() {
				dirty()
				t0 := time.Now()
				var err error
				if c, err = box.Checkpoint(ctx, fmt.Sprintf("c%d-%d", i, j)); err != nil {
					b.Fatal(err)
				}
				ckptT, ckptP, ckptB = append(ckptT, time.Since(t0)), append(ckptP, c.Paused), append(ckptB, c.StateBytes+c.DiskBytes)
			}
			rollback := func() {
				dirty()
				t0 := time.Now()
				if err := box.Rollback(ctx, c.Name); err != nil {
					b.Fatal(err)
				}
				tx := time.Now()
				firstExec(box)
				rollT, rollX = append(rollT, time.Since(t0)), append(rollX, time.Since(tx))
			}
			restore := func() {
				t0 := time.Now()
				rb, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: s.Name})
				if err != nil {
					b.Fatal(err)
				}
				tx := time.Now()
				firstExec(rb)
				restT, restX = append(restT, time.Since(t0)), append(restX, time.Since(tx))
				rb.Remove(ctx, true)
			}
			if j%2 == 0 {
				snap()
				ckpt()
				rollback()
				restore()
			} else {
				ckpt()
				snap()
				restore()
				rollback()
			}
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
		b.ReportMetric(mb(ckptB)/mb(snapB), "ckpt/snap-disk")
		b.ReportMetric(float64(rt)/float64(rs), "rollback/restore")
	}
}
