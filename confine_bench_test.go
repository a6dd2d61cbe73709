package airlock_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// BenchmarkConfinement compares boxes with QEMU confinement on and off in
// one run, the two interleaved so that the load of a shared machine falls
// on both alike: cold start (Create until a first exec of `true` has
// answered, median of 7 per mode; without and with a network, whose
// helper is confined too) and the exec round trip of `true` (median of 200
// per mode, 50 alternating on each of 4 pairs of boxes, and the CPU time
// the boxes' QEMUs spent per exec). It reports each as a metric (on-*, off-*) and the ratio of the
// cold starts. BenchmarkConfinementLayers breaks the cost down by layer;
// docs/confinement.md ("Cost") has the numbers.
//
// go test -run '^$' -bench 'BenchmarkConfinement$' -benchtime=1x .
func BenchmarkConfinement(b *testing.B) {
	vmtest.Require(b)
	ctx := context.Background()
	open := func(off bool) *airlock.Runtime {
		r, err := airlock.Open(airlock.Options{Home: b.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}, Unconfined: off})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		return r
	}
	rt := map[bool]*airlock.Runtime{false: open(false), true: open(true)}
	median := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	start := func(r *airlock.Runtime, o airlock.BoxOptions) (*airlock.Box, time.Duration) {
		t0 := time.Now()
		box, err := r.Create(ctx, o)
		if err != nil {
			b.Fatal(err)
		}
		if res, err := box.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %+v %v", res, err)
		}
		return box, time.Since(t0)
	}
	name := map[bool]string{false: "on", true: "off"}
	for i := 0; i < b.N; i++ {
		for _, net := range []airlock.NetworkMode{airlock.NetworkNone, airlock.NetworkPublic} {
			cold := map[bool][]time.Duration{}
			for j := 0; j < 7; j++ {
				for _, off := range []bool{j%2 == 0, j%2 != 0} {
					box, d := start(rt[off], airlock.BoxOptions{Network: net})
					cold[off] = append(cold[off], d)
					box.Remove(ctx, true)
				}
			}
			on, off := median(cold[false]), median(cold[true])
			b.ReportMetric(float64(on.Milliseconds()), name[false]+"-start-"+string(net)+"-ms")
			b.ReportMetric(float64(off.Milliseconds()), name[true]+"-start-"+string(net)+"-ms")
			b.ReportMetric(float64(on)/float64(off), "start-"+string(net)+"-ratio")
		}
		// Execs: 4 pairs of boxes (a box's own luck, such as where its
		// memory landed, moves its round trips by a few per cent), 50
		// alternating execs on each pair.
		rtt := map[bool][]time.Duration{}
		cpu := map[bool]time.Duration{}
		for pair := 0; pair < 4; pair++ {
			boxes := map[bool]*airlock.Box{}
			before := map[bool][2]time.Duration{}
			for _, off := range []bool{pair%2 == 0, pair%2 != 0} {
				boxes[off], _ = start(rt[off], airlock.BoxOptions{Network: airlock.NetworkDisabled})
				for j := 0; j < 5; j++ { // warm-up
					boxes[off].Exec(ctx, "true", nil, airlock.ExecOptions{})
				}
				before[off] = qemuSchedstat(b, rt[off], boxes[off])
			}
			for j := 0; j < 50; j++ {
				for _, off := range []bool{j%2 == 0, j%2 != 0} {
					t0 := time.Now()
					if _, err := boxes[off].Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil {
						b.Fatal(err)
					}
					rtt[off] = append(rtt[off], time.Since(t0))
				}
			}
			for _, off := range []bool{false, true} {
				cpu[off] += qemuSchedstat(b, rt[off], boxes[off])[0] - before[off][0]
				boxes[off].Remove(ctx, true)
			}
		}
		for _, off := range []bool{false, true} {
			b.ReportMetric(float64(median(rtt[off]).Microseconds()), name[off]+"-exec-us")
			// QEMU's CPU time per exec: what the confinement could add to
			// QEMU's own work, unlike the wall time not moved by the load
			// of a shared machine.
			b.ReportMetric(float64((cpu[off] / 200).Microseconds()), name[off]+"-qemu-cpu-us/exec")
		}
	}
}
