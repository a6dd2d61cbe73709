package airlock_test

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
	"github.com/airlock-run/airlock/internal/vmm/qemu"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// BenchmarkConfinementLayers measures what each layer of the QEMU
// confinement costs: boxes confined fully ("on"), not at all ("off"), and
// without one layer each ("-seccomp", "-cgroup", "-uid", "-netns",
// "-jail"). Each round starts one box of every variant, in an
// order that rotates round by round (the load of a shared machine falls
// on all alike) and takes its cold start (Create until a first exec of
// `true` has answered); then, after 5 warm-up execs each, it runs
// AIRLOCK_BENCH_EXECS (40) execs of `true` on each box, alternating
// between the boxes, and removes them. It reports the medians over
// AIRLOCK_BENCH_ROUNDS (9) rounds. AIRLOCK_BENCH_LAYERS
// (comma-separated variant names) picks the variants.
//
// go test -run '^$' -bench BenchmarkConfinementLayers -benchtime=1x .
func BenchmarkConfinementLayers(b *testing.B) {
	vmtest.Require(b)
	ctx := context.Background()
	variants := []string{"off", "on", "-seccomp", "-cgroup", "-uid", "-netns", "-jail"}
	if v := os.Getenv("AIRLOCK_BENCH_LAYERS"); v != "" {
		variants = strings.Split(v, ",")
	}
	rounds, execs := 9, 40
	if n, err := strconv.Atoi(os.Getenv("AIRLOCK_BENCH_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	if n, err := strconv.Atoi(os.Getenv("AIRLOCK_BENCH_EXECS")); err == nil && n > 0 {
		execs = n
	}
	rt := map[string]*airlock.Runtime{}
	for _, v := range variants {
		o := airlock.Options{Home: b.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}}
		var r *airlock.Runtime
		var err error
		switch {
		case v == "off":
			o.Unconfined = true
			r, err = airlock.Open(o)
		case v == "on":
			r, err = airlock.Open(o)
		case strings.HasPrefix(v, "-"):
			r, err = airlock.OpenConfinedWithout(o, qemu.Layer(v[1:]))
		default:
			b.Fatalf("unknown variant %q", v)
		}
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		rt[v] = r
	}
	median := func(d []time.Duration) time.Duration {
		d = append([]time.Duration(nil), d...)
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	exec := func(box *airlock.Box) time.Duration {
		t0 := time.Now()
		if res, err := box.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %+v %v", res, err)
		}
		return time.Since(t0)
	}
	for i := 0; i < b.N; i++ {
		start := map[string][]time.Duration{}
		rtt := map[string][]time.Duration{}
		cpu := map[string][]time.Duration{}  // QEMU's CPU time per exec, by round
		wait := map[string][]time.Duration{} // QEMU's time runnable but not running, per exec
		for round := 0; round < rounds; round++ {
			boxes := map[string]*airlock.Box{}
			for k := range variants {
				v := variants[(k+round)%len(variants)]
				t0 := time.Now()
				box, err := rt[v].Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled})
				if err != nil {
					b.Fatalf("%s: %v", v, err)
				}
				exec(box)
				start[v] = append(start[v], time.Since(t0))
				boxes[v] = box
			}
			for _, v := range variants {
				for j := 0; j < 5; j++ {
					exec(boxes[v])
				}
			}
			// The execs alternate between the boxes (all running), so
			// that the load falls on each variant alike.
			before := map[string][2]time.Duration{}
			for _, v := range variants {
				before[v] = qemuSchedstat(b, rt[v], boxes[v])
			}
			for j := 0; j < execs; j++ {
				for k := range variants {
					v := variants[(k+j)%len(variants)]
					rtt[v] = append(rtt[v], exec(boxes[v]))
				}
			}
			for _, v := range variants {
				after := qemuSchedstat(b, rt[v], boxes[v])
				cpu[v] = append(cpu[v], (after[0]-before[v][0])/time.Duration(execs))
				wait[v] = append(wait[v], (after[1]-before[v][1])/time.Duration(execs))
			}
			for _, box := range boxes {
				box.Remove(ctx, true)
			}
		}
		off := map[string]time.Duration{"start": median(start["off"]), "exec": median(rtt["off"])}
		var tab strings.Builder
		fmt.Fprintf(&tab, "%-12s %10s %10s %14s %14s\n", "variant", "start ms", "exec us", "qemu cpu/exec", "qemu wait/exec")
		for _, v := range variants {
			s, e := median(start[v]), median(rtt[v])
			fmt.Fprintf(&tab, "%-12s %10.1f %10d %11d us %11d us", v, float64(s.Microseconds())/1000, e.Microseconds(),
				median(cpu[v]).Microseconds(), median(wait[v]).Microseconds())
			if off["start"] > 0 && v != "off" {
				fmt.Fprintf(&tab, "   start %.3fx, exec %+d us", float64(s)/float64(off["start"]), (e - off["exec"]).Microseconds())
			}
			tab.WriteString("\n")
			b.ReportMetric(float64(s.Microseconds())/1000, v+"-start-ms")
			b.ReportMetric(float64(e.Microseconds()), v+"-exec-us")
			b.ReportMetric(float64(median(cpu[v]).Microseconds()), v+"-qemu-cpu-us/exec")
		}
		b.Logf("medians of %d rounds (%d execs each):\n%s", rounds, execs, tab.String())
	}
}

// qemuSchedstat returns the CPU time and the run-queue wait of all
// threads of box's QEMU so far (/proc/PID/task/*/schedstat).
func qemuSchedstat(b *testing.B, r *airlock.Runtime, box *airlock.Box) [2]time.Duration {
	raw, err := os.ReadFile(filepath.Join(r.Home(), "boxes", box.ID(), "qemu.pid"))
	if err != nil {
		b.Fatal(err)
	}
	tasks, _ := filepath.Glob("/proc/" + strings.TrimSpace(string(raw)) + "/task/*/schedstat")
	var sum [2]time.Duration
	for _, t := range tasks {
		f, _ := os.ReadFile(t)
		var run, wait int64
		fmt.Sscan(string(f), &run, &wait)
		sum[0] += time.Duration(run)
		sum[1] += time.Duration(wait)
	}
	return sum
}
