package bench

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/defaults"
)

// BurstOptions configure RunBurst.
type BurstOptions struct {
	// Image of the boxes; default airlock.DefaultImage.
	Image string
	// Runs is how many sequential creates each sequential figure takes
	// (default 5).
	Runs int
	// Burst is how many creates go at once (default 10); the pool has as
	// many boxes.
	Burst int
	// Density is how many idle boxes the density figure starts (default
	// 8; 0 with NoDensity).
	Density   int
	NoDensity bool
	// ImagesDir, CacheDir: as in Options (default: the default stores).
	ImagesDir, CacheDir string
	// Log receives progress lines (nil: none).
	Log func(format string, a ...any)
}

// Spread is the p50 and p95 of a set of samples (nearest rank).
type Spread struct {
	N        int
	P50, P95 time.Duration
}

// BurstReport is what RunBurst measures: time to interactive (Create to
// the first Exec("true") result, as ComputeSDK's sandbox benchmark
// measures it), cold and from a warm pool, one at a time and Burst at
// once; and the host memory of idle boxes, running and suspended.
type BurstReport struct {
	Image                      string
	ColdSeq, ColdBurst         Spread
	PoolSeq, PoolBurst         Spread
	Density                    int
	RunningPSSKiB              int64 // per box: QEMU's PSS, mean
	SuspendedPSSKiB            int64 // per box: the host processes left (none)
	SuspendedDiskKiB           int64 // per box: the saved state and layer on disk, mean
	SuspendTime, ResumeToFirst Spread
}

func spread(ds []time.Duration) Spread {
	if len(ds) == 0 {
		return Spread{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))+0.999)-1)] }
	return Spread{N: len(s), P50: at(0.5), P95: at(0.95)}
}

// tti creates a box of opts and runs `true` in it: the time from Create to
// the result. The box is removed (not timed).
func tti(ctx context.Context, r *airlock.Runtime, opts airlock.BoxOptions) (time.Duration, error) {
	t0 := time.Now()
	b, err := r.Create(ctx, opts)
	if err != nil {
		return 0, err
	}
	defer b.Remove(context.WithoutCancel(ctx), true)
	if res, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil || res.ExitCode != 0 {
		return 0, fmt.Errorf("exec true: %v %v", res.ExitCode, err)
	}
	return time.Since(t0), nil
}

// burst runs n ttis at once.
func burst(ctx context.Context, r *airlock.Runtime, opts airlock.BoxOptions, n int) ([]time.Duration, error) {
	var mu sync.Mutex
	var ds []time.Duration
	var first error
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := tti(ctx, r, opts)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			if err == nil {
				ds = append(ds, d)
			}
		}()
	}
	wg.Wait()
	return ds, first
}

// pssKiB is the proportional set size of process pid (KiB; 0 when gone).
func pssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// diskKiB is the space allocated to the files under dir.
func diskKiB(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512 / 1024
			}
		}
		return nil
	})
	return n
}

// RunBurst measures time to interactive and density (BurstReport) in
// temporary homes. It is a benchmark: figures depend on the host and its
// load, and nothing is asserted.
func RunBurst(ctx context.Context, o BurstOptions) (*BurstReport, error) {
	if o.Image == "" {
		o.Image = airlock.DefaultImage
	}
	if o.Runs <= 0 {
		o.Runs = 5
	}
	if o.Burst <= 0 {
		o.Burst = 10
	}
	if o.Density <= 0 {
		o.Density = 8
	}
	if o.ImagesDir == "" {
		o.ImagesDir = defaults.Images()
	}
	if o.CacheDir == "" {
		o.CacheDir = defaults.Cache()
	}
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	open := func(pool []airlock.PoolOptions) (*airlock.Runtime, string, error) {
		home, err := os.MkdirTemp("", "airlock-bench-burst-")
		if err != nil {
			return nil, "", err
		}
		r, err := airlock.Open(airlock.Options{Home: home, ImagesDir: o.ImagesDir, CacheDir: o.CacheDir, Warn: func(string) {}, Pool: pool})
		if err != nil {
			os.RemoveAll(home)
			return nil, "", err
		}
		return r, home, nil
	}
	opts := airlock.BoxOptions{Image: o.Image, Network: airlock.NetworkNone}
	rep := &BurstReport{Image: o.Image}

	// Cold: one at a time, then Burst at once.
	r, home, err := open(nil)
	if err != nil {
		return nil, err
	}
	var seq []time.Duration
	for i := range o.Runs {
		d, err := tti(ctx, r, opts)
		if err != nil {
			r.Close()
			os.RemoveAll(home)
			return nil, err
		}
		logf("cold %d: %s", i+1, d.Round(time.Millisecond))
		seq = append(seq, d)
	}
	rep.ColdSeq = spread(seq)
	ds, err := burst(ctx, r, opts, o.Burst)
	logf("cold burst of %d: %v", o.Burst, ds)
	rep.ColdBurst = spread(ds)
	if err != nil {
		r.Close()
		os.RemoveAll(home)
		return nil, err
	}

	// Density: idle boxes running, then suspended.
	if !o.NoDensity {
		var boxes []*airlock.Box
		for range o.Density {
			b, err := r.Create(ctx, opts)
			if err != nil {
				break
			}
			boxes = append(boxes, b)
		}
		rep.Density = len(boxes)
		time.Sleep(3 * time.Second) // idle
		var pss, disk int64
		for _, b := range boxes {
			if in, err := b.Info(ctx); err == nil {
				pss += pssKiB(in.PID)
			}
		}
		var susp, wake []time.Duration
		var left int64
		for _, b := range boxes {
			in, _ := b.Info(ctx)
			t0 := time.Now()
			if err := b.Suspend(ctx); err != nil {
				logf("suspend: %v", err)
				continue
			}
			susp = append(susp, time.Since(t0))
			left += pssKiB(in.PID)
			disk += diskKiB(filepath.Join(home, "boxes", b.ID()))
		}
		for _, b := range boxes {
			t0 := time.Now()
			if err := b.Resume(ctx); err == nil {
				if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); err == nil {
					wake = append(wake, time.Since(t0))
				}
			}
			b.Remove(ctx, true)
		}
		if n := int64(len(boxes)); n > 0 {
			rep.RunningPSSKiB, rep.SuspendedPSSKiB, rep.SuspendedDiskKiB = pss/n, left/n, disk/max(int64(len(susp)), 1)
		}
		rep.SuspendTime, rep.ResumeToFirst = spread(susp), spread(wake)
		logf("density: %d boxes, %d KiB PSS each running, %d KiB suspended (disk %d KiB)", len(boxes), rep.RunningPSSKiB, rep.SuspendedPSSKiB, rep.SuspendedDiskKiB)
	}
	r.Close()
	os.RemoveAll(home)

	// From a warm pool of Burst boxes: one at a time (the pool full before
	// each), then Burst at once.
	r, home, err = open([]airlock.PoolOptions{{BoxOptions: opts, Size: o.Burst}})
	if err != nil {
		return nil, err
	}
	defer func() {
		r.Close()
		os.RemoveAll(home)
	}()
	full := func() error {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		if err := r.WaitPools(wctx); err != nil {
			return err
		}
		time.Sleep(2 * time.Second) // the last fill's host work settles
		return nil
	}
	seq = nil
	for i := range o.Runs {
		if err := full(); err != nil {
			return nil, err
		}
		d, err := tti(ctx, r, opts)
		if err != nil {
			return nil, err
		}
		logf("pool %d: %s", i+1, d.Round(time.Millisecond))
		seq = append(seq, d)
	}
	rep.PoolSeq = spread(seq)
	if err := full(); err != nil {
		return nil, err
	}
	ds, err = burst(ctx, r, opts, o.Burst)
	logf("pool burst of %d: %v", o.Burst, ds)
	rep.PoolBurst = spread(ds)
	return rep, err
}
