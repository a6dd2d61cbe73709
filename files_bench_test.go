package airlock_test

import (
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

func median(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

// guestSeconds runs script in the box and returns how long it took there.
func guestSeconds(b *testing.B, box *airlock.Box, script string) float64 {
	res, err := box.Exec(context.Background(), "sh", []string{"-c", "s=$(date +%s%N); " + script + "; e=$(date +%s%N); echo $((e-s))"}, airlock.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("%s: %v %s", script, err, res.Stderr)
	}
	ns, _ := strconv.ParseFloat(strings.TrimSpace(string(res.Stdout)), 64)
	return ns / 1e9
}

// BenchmarkFiles (run with -benchtime=1x): CopyIn/CopyOut of 256 MiB
// (AIRLOCK_BENCH_COPY_MIB to change it, e.g. 1024) against piping the same
// bytes through `exec cat`, reading them from a host volume (9p) against
// the box's own disk, a Stat round trip against an exec round trip, and
// host directories over 9p against virtio-fs against the box's disk
// (benchVolumeTransports).
func BenchmarkFiles(b *testing.B) {
	vmtest.Require(b)
	mib := 256
	if v, err := strconv.Atoi(os.Getenv("AIRLOCK_BENCH_COPY_MIB")); err == nil && v > 0 {
		mib = v
	}
	size := int64(mib) << 20
	r, err := airlock.Open(airlock.Options{Home: b.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	vol := b.TempDir()
	src := filepath.Join(vol, "big")
	f, _ := os.Create(src)
	io.CopyN(f, rand.Reader, size)
	f.Close()
	box, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled, MemoryMiB: 1024, DiskSizeMiB: max(4096, 3*mib), Volumes: []airlock.Volume{{Source: vol, Target: "/vol", ReadOnly: true}}})
	if err != nil {
		b.Fatal(err)
	}
	defer box.Remove(ctx, true)
	mbps := func(d time.Duration) float64 { return float64(mib) / d.Seconds() }
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := box.CopyIn(ctx, src, "/tmp/in"); err != nil {
			b.Fatal(err)
		}
		copyIn := time.Since(t0)
		in, _ := os.Open(src)
		t0 = time.Now()
		res, err := box.Exec(ctx, "sh", []string{"-c", "cat > /tmp/cat"}, airlock.ExecOptions{Stdin: in})
		catIn := time.Since(t0)
		in.Close()
		if err != nil || res.ExitCode != 0 {
			b.Fatal(err, res)
		}
		out := filepath.Join(b.TempDir(), "out")
		t0 = time.Now()
		if err := box.CopyOut(ctx, "/tmp/in", out); err != nil {
			b.Fatal(err)
		}
		copyOut := time.Since(t0)
		t0 = time.Now()
		p, err := box.ExecStream(ctx, "cat", []string{"/tmp/in"}, airlock.ExecOptions{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard})
		if err != nil {
			b.Fatal(err)
		}
		p.Wait()
		catOut := time.Since(t0)
		b.Logf("CopyIn %d MiB %v (%.0f MiB/s), exec cat stdin %v (%.0f MiB/s): %.2fx", mib, copyIn.Round(time.Millisecond), mbps(copyIn), catIn.Round(time.Millisecond), mbps(catIn), catIn.Seconds()/copyIn.Seconds())
		b.Logf("CopyOut %d MiB %v (%.0f MiB/s), exec cat stdout %v (%.0f MiB/s): %.2fx", mib, copyOut.Round(time.Millisecond), mbps(copyOut), catOut.Round(time.Millisecond), mbps(catOut), catOut.Seconds()/copyOut.Seconds())
		b.ReportMetric(catIn.Seconds()/copyIn.Seconds(), "copyin/cat-x")
		b.ReportMetric(catOut.Seconds()/copyOut.Seconds(), "copyout/cat-x")

		// Reads with cold caches in the guest (the host's page cache is warm
		// for both: the volume file and the box's disk image).
		disk := guestSeconds(b, box, "sync; echo 3 > /proc/sys/vm/drop_caches; cat /tmp/in > /dev/null")
		ninep := guestSeconds(b, box, "echo 3 > /proc/sys/vm/drop_caches; cat /vol/big > /dev/null")
		b.Logf("read %d MiB in the box: box disk %.2f s (%.0f MiB/s), 9p volume %.2f s (%.0f MiB/s): 9p/disk time %.2f", mib, disk, float64(mib)/disk, ninep, float64(mib)/ninep, ninep/disk)
		b.ReportMetric(ninep/disk, "9p/disk-time")

		var stat, ex []time.Duration
		for j := 0; j < 30; j++ {
			t0 := time.Now()
			if _, err := box.Stat(ctx, "/tmp/in"); err != nil {
				b.Fatal(err)
			}
			stat = append(stat, time.Since(t0))
			t0 = time.Now()
			if _, err := box.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil {
				b.Fatal(err)
			}
			ex = append(ex, time.Since(t0))
		}
		b.Logf("round trip (median of 30): Stat %v, exec true %v", median(stat), median(ex))
		b.ReportMetric(float64(median(stat).Microseconds()), "stat-us")
		b.ReportMetric(float64(median(ex).Microseconds()), "exec-us")
		box.Exec(ctx, "rm", []string{"/tmp/in", "/tmp/cat"}, airlock.ExecOptions{})
		benchVolumeTransports(b, mib)
	}
}
