// Package bench measures box boot and exec costs against the bare limit
// (the same QEMU command line with a trivial init) for `airlock bench`. It
// measures only; the project's targets and verdicts live with the command
// (internal/cli/bench.go).
package bench

import (
	"context"
	"fmt"
	"github.com/airlock-run/airlock/internal/measure"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// Options configure Run.
type Options struct {
	// Runs per measurement (medians are reported); default 5.
	Runs int
	// Image to boot; default airlock.DefaultImage.
	Image string
	// Kernels to compare (vmlinux paths). Default: the kernel boxes boot
	// now, plus the Debian kernel from the cache when that is another one.
	Kernels []string
	// ImagesDir, CacheDir, AgentPath, Accel as in Options.
	ImagesDir, CacheDir, AgentPath, Accel string
	// Log receives progress lines (nil: none).
	Log io.Writer
}

// Kernel holds one kernel's figures (medians).
type Kernel struct {
	Kernel, Kind, Version string
	// Bare is QEMU launch to the marker of a trivial init that runs the
	// image's /bin/true, on the same QEMU
	// command line, kernel and disks as a box: the lower limit.
	Bare time.Duration
	// ColdStart is Create to the first Exec("true") result; FirstExec
	// that first Exec alone (from Create's return: the guest's first
	// exec, which the agent's prewarm makes a warm one).
	ColdStart, FirstExec time.Duration
	// FirstPython is Create to the first `python3 -c` output.
	FirstPython time.Duration
	// ExecRoundTrip is the host-side time of Exec("true") in a running box;
	// GuestExec is the agent's own time for it (spawn, wait, drain).
	ExecRoundTrip, GuestExec time.Duration
	// RSS of QEMU (KiB): an idle box vs the bare init, and peak (VmHWM).
	IdleRSS, BareRSS, PeakRSS, BarePeakRSS int64
}

// Report is the result of Run.
type Report struct {
	Accel   string
	Runs    int
	Kernels []Kernel
}

// median returns the middle value, or the mean of the two middle values
// for an even count.
// Run measures box boot and exec costs against the bare limit, for each
// kernel, in one run: see Kernel for what is measured. It boots 3×Runs
// VMs per kernel, alternating between the kernels run by run so that drift
// in the host's load affects all of them alike.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Runs <= 0 {
		o.Runs = 5
	}
	if o.Image == "" {
		o.Image = airlock.DefaultImage
	}
	if o.ImagesDir == "" {
		// Boxes live in a temporary home; images come from the default
		// store ($AIRLOCK_IMAGES, else AIRLOCK_HOME/images).
		o.ImagesDir = defaults.Images()
	}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", a...)
		}
	}
	if o.CacheDir == "" {
		o.CacheDir = defaults.Cache()
	}
	if len(o.Kernels) == 0 {
		cache := o.CacheDir
		k, _, err := assets.FindKernel(cache)
		if err != nil {
			return nil, err
		}
		o.Kernels = append(o.Kernels, k.Path)
		if d, err := filepath.EvalSymlinks(filepath.Join(cache, "kernel", "debian")); err == nil {
			if p := filepath.Join(d, "vmlinux"); p != k.Path {
				if _, err := os.Stat(p); err == nil {
					o.Kernels = append(o.Kernels, p)
				}
			}
		}
	}
	rep := &Report{Runs: o.Runs}
	// Runs go round-robin over the kernels, so that every kernel sees the
	// same machine state (load on the host drifts over a run).
	var ks []*kernelRuns
	defer func() {
		for _, k := range ks {
			k.close()
		}
	}()
	for _, kp := range o.Kernels {
		k, err := newKernelRuns(o, kp, logf)
		if err != nil {
			return nil, fmt.Errorf("kernel %s: %w", kp, err)
		}
		ks = append(ks, k)
		rep.Accel = k.boot.Accel
	}
	for i := 0; i < o.Runs; i++ {
		for _, k := range ks {
			if err := k.run(ctx, i); err != nil {
				return nil, fmt.Errorf("kernel %s: %w", k.kb.Kernel, err)
			}
		}
	}
	for _, k := range ks {
		rep.Kernels = append(rep.Kernels, k.summary())
	}
	return rep, nil
}

// kernelRuns holds one kernel's runtime (in a temporary home) and samples.
type kernelRuns struct {
	o                                Options
	home                             string
	r                                *airlock.Runtime
	drv                              *qemu.Driver // for the bare limit
	images                           *image.Store
	boot                             airlock.BootInfo
	kb                               Kernel
	logf                             func(string, ...any)
	bare, cold, first, py, rt, guest []time.Duration
	bareRSS, barePeak, idle, peak    []int64
}

func newKernelRuns(o Options, kernel string, logf func(string, ...any)) (*kernelRuns, error) {
	home, err := os.MkdirTemp("", "airlock-bench-")
	if err != nil {
		return nil, err
	}
	r, err := airlock.Open(airlock.Options{Home: home, ImagesDir: o.ImagesDir, CacheDir: o.CacheDir, AgentPath: o.AgentPath,
		Accel: o.Accel, Kernel: kernel, Warn: func(string) {}})
	if err != nil {
		os.RemoveAll(home)
		return nil, err
	}
	k := &kernelRuns{o: o, home: home, r: r, logf: logf}
	if k.boot, err = r.BootInfo(); err != nil {
		k.close()
		return nil, err
	}
	if k.images, err = image.Open(o.ImagesDir); err != nil {
		k.close()
		return nil, err
	}
	k.drv = qemu.New(qemu.Options{Accel: o.Accel, Kernel: kernel, AgentPath: o.AgentPath, CacheDir: o.CacheDir, THP: defaults.THP()})
	k.kb = Kernel{Kernel: kernel, Kind: k.boot.KernelKind, Version: k.boot.KernelVer}
	logf("kernel %s (%s %s), accel %s", kernel, k.kb.Kind, k.kb.Version, k.boot.Accel)
	return k, nil
}

func (k *kernelRuns) close() {
	k.r.Close()
	os.RemoveAll(k.home)
}

// bareRun boots the image with the bare init (AIRLOCK_BARE=1) on a box's
// QEMU command line and samples the time to its marker and QEMU's memory.
func (k *kernelRuns) bareRun(ctx context.Context, i int) error {
	img, err := k.images.Resolve(k.o.Image)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(k.home, "bare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	spec := vmm.Spec{ID: fmt.Sprintf("bare%08d", i), Dir: dir, CPUs: airlock.DefaultCPUs, MemoryMiB: airlock.DefaultMemoryMiB,
		DiskSizeMiB: airlock.DefaultDiskSizeMiB, Net: &vmm.NetSpec{} /* QEMU slirp: nothing to connect it to */, Hostname: "bare",
		ExtraCmdline: []string{guestabi.BareParam}}
	// The disks, as the lifecycle code prepares them for a box.
	base, err := rootfs.Base(ctx, k.images, img, k.o.CacheDir)
	if err != nil {
		return err
	}
	spec.Disks = vmm.Disks{Base: base, Layer: filepath.Join(dir, boxdir.RW)}
	if err := rootfs.NewDisk(spec.Disks.Layer, spec.DiskSizeMiB, k.o.CacheDir); err != nil {
		return err
	}
	if err := k.drv.Create(ctx, spec); err != nil {
		return err
	}
	t0 := time.Now()
	m, err := k.drv.Start(ctx, spec)
	if err != nil {
		return err
	}
	defer m.Kill()
	for {
		c, _ := os.ReadFile(filepath.Join(dir, boxdir.Console))
		if strings.Contains(string(c), guestabi.BareMarker) {
			break
		}
		if time.Since(t0) > 2*time.Minute || !m.Alive() {
			return fmt.Errorf("bare init printed no marker; console:\n%s", c)
		}
		time.Sleep(2 * time.Millisecond)
	}
	k.bare = append(k.bare, time.Since(t0))
	time.Sleep(time.Second)
	pid := m.Handle().PID
	k.bareRSS = append(k.bareRSS, measure.ProcStatusKiB(pid, "VmRSS"))
	k.barePeak = append(k.barePeak, measure.ProcStatusKiB(pid, "VmHWM"))
	return nil
}

// run takes one sample of every figure.
func (k *kernelRuns) run(ctx context.Context, i int) error {
	r := k.r
	opts := airlock.BoxOptions{Image: k.o.Image, Network: airlock.NetworkPublic}
	if err := k.bareRun(ctx, i); err != nil {
		return err
	}

	// Cold start: Create -> first Exec("true").
	t0 := time.Now()
	b, err := r.Create(ctx, opts)
	if err != nil {
		return err
	}
	t1 := time.Now()
	if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil {
		b.Remove(ctx, true)
		return err
	}
	k.cold = append(k.cold, time.Since(t0))
	k.first = append(k.first, time.Since(t1))
	time.Sleep(time.Second)
	info, err := b.Info(ctx)
	if err != nil {
		b.Remove(ctx, true)
		return err
	}
	qpid := info.PID
	k.idle = append(k.idle, measure.ProcStatusKiB(qpid, "VmRSS"))
	for j := 0; j < 10; j++ {
		res, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{})
		if err != nil {
			b.Remove(ctx, true)
			return err
		}
		k.rt = append(k.rt, res.Duration)
		k.guest = append(k.guest, res.GuestDuration)
	}
	k.peak = append(k.peak, measure.ProcStatusKiB(qpid, "VmHWM"))
	b.Remove(ctx, true)

	// First python3 -c output.
	t0 = time.Now()
	b, err = r.Create(ctx, opts)
	if err != nil {
		return err
	}
	res, err := b.Exec(ctx, "python3", []string{"-c", "print(1)"}, airlock.ExecOptions{})
	if err != nil || string(res.Stdout) != "1\n" {
		b.Remove(ctx, true)
		return fmt.Errorf("python3 -c: %v %v", res, err)
	}
	k.py = append(k.py, time.Since(t0))
	b.Remove(ctx, true)
	k.logf("  %s run %d: bare %s, cold start %s (first exec %s), first python %s, peak RSS %d MiB", k.kb.Kind, i+1,
		k.bare[i].Round(time.Millisecond), k.cold[i].Round(time.Millisecond), k.first[i].Round(time.Millisecond), k.py[i].Round(time.Millisecond), k.peak[i]>>10)
	return nil
}

func (k *kernelRuns) summary() Kernel {
	kb := k.kb
	kb.Bare, kb.ColdStart, kb.FirstExec, kb.FirstPython = measure.Median(k.bare), measure.Median(k.cold), measure.Median(k.first), measure.Median(k.py)
	kb.ExecRoundTrip, kb.GuestExec = measure.Median(k.rt), measure.Median(k.guest)
	kb.BareRSS, kb.BarePeakRSS, kb.IdleRSS, kb.PeakRSS = measure.Median(k.bareRSS), measure.Median(k.barePeak), measure.Median(k.idle), measure.Median(k.peak)
	return kb
}
