package airlock

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// BenchOptions configure Bench.
type BenchOptions struct {
	// Runs per measurement (medians are reported); default 5.
	Runs int
	// Image to boot; default DefaultImage.
	Image string
	// Kernels to compare (vmlinux paths). Default: the kernel boxes boot
	// now, plus the Debian kernel from the cache when that is another one.
	Kernels []string
	// ImagesDir, CacheDir, AgentPath, Accel as in Options.
	ImagesDir, CacheDir, AgentPath, Accel string
	// Log receives progress lines (nil: none).
	Log io.Writer
}

// KernelBench holds one kernel's figures (medians).
type KernelBench struct {
	Kernel, Kind, Version string
	// Bare is QEMU launch to the marker of a trivial init that runs the
	// image's /bin/true, on the same QEMU
	// command line, kernel and disks as a box: the lower limit.
	Bare time.Duration
	// ColdStart is Create to the first Exec("true") result.
	ColdStart time.Duration
	// FirstPython is Create to the first `python3 -c` output.
	FirstPython time.Duration
	// ExecRoundTrip is the host-side time of Exec("true") in a running box;
	// GuestExec is the agent's own time for it (spawn, wait, drain).
	ExecRoundTrip, GuestExec time.Duration
	// RSS of QEMU (KiB): an idle box vs the bare init, and peak (VmHWM).
	IdleRSS, BareRSS, PeakRSS, BarePeakRSS int64
}

// BenchReport is the result of Bench.
type BenchReport struct {
	Accel   string
	Runs    int
	Kernels []KernelBench
}

// median returns the middle value, or the mean of the two middle values
// for an even count.
func median(d []time.Duration) time.Duration {
	v := make([]int64, len(d))
	for i, x := range d {
		v[i] = int64(x)
	}
	return time.Duration(medianInt(v))
}

func medianInt(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	n := len(s)
	if n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}

// procStatus reads a "VmXXX:  N kB" field of /proc/PID/status, in KiB.
func procStatus(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field+":") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				return v
			}
		}
	}
	return 0
}

// Bench measures box boot and exec costs against the bare limit, for each
// kernel, in one run: see KernelBench for what is measured. It boots 3×Runs
// VMs per kernel, alternating between the kernels run by run so that drift
// in the host's load affects all of them alike.
func Bench(ctx context.Context, o BenchOptions) (*BenchReport, error) {
	if o.Runs <= 0 {
		o.Runs = 5
	}
	if o.Image == "" {
		o.Image = DefaultImage
	}
	if o.ImagesDir == "" {
		// Boxes live in a temporary home; images come from the default
		// store ($AIRLOCK_IMAGES, else AIRLOCK_HOME/images).
		d, err := image.DefaultDir()
		if err != nil {
			return nil, err
		}
		o.ImagesDir = d
	}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", a...)
		}
	}
	if len(o.Kernels) == 0 {
		cache := o.CacheDir
		if cache == "" {
			cache = assets.CacheDir()
		}
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
	rep := &BenchReport{Runs: o.Runs}
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
		rep.Accel = k.boot.accel.Accel
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
	o                             BenchOptions
	home                          string
	r                             *Runtime
	boot                          *bootAssets
	kb                            KernelBench
	logf                          func(string, ...any)
	bare, cold, py, rt, guest     []time.Duration
	bareRSS, barePeak, idle, peak []int64
}

func newKernelRuns(o BenchOptions, kernel string, logf func(string, ...any)) (*kernelRuns, error) {
	home, err := os.MkdirTemp("", "airlock-bench-")
	if err != nil {
		return nil, err
	}
	r, err := Open(Options{Home: home, ImagesDir: o.ImagesDir, CacheDir: o.CacheDir, AgentPath: o.AgentPath,
		Accel: o.Accel, Kernel: kernel, Warn: func(string) {}})
	if err != nil {
		os.RemoveAll(home)
		return nil, err
	}
	k := &kernelRuns{o: o, home: home, r: r, logf: logf}
	if k.boot, err = r.bootAssets(); err != nil {
		k.close()
		return nil, err
	}
	k.kb = KernelBench{Kernel: kernel, Kind: k.boot.kernel.Kind, Version: k.boot.kernel.Version}
	logf("kernel %s (%s %s), accel %s", kernel, k.kb.Kind, k.kb.Version, k.boot.accel.Accel)
	return k, nil
}

func (k *kernelRuns) close() {
	k.r.Close()
	os.RemoveAll(k.home)
}

// run takes one sample of every figure.
func (k *kernelRuns) run(ctx context.Context, i int) error {
	r := k.r
	opts := BoxOptions{Image: k.o.Image, Network: NetworkEnabled}
	// Bare limit: same command line, trivial init.
	b, err := r.newBox(ctx, opts)
	if err != nil {
		return err
	}
	img, err := b.image()
	if err != nil {
		return err
	}
	base, err := rootfs.Base(ctx, r.images, img, r.opts.CacheDir)
	if err != nil {
		return err
	}
	var cid uint32
	if qemu.VsockAvailable() {
		cid = randomCID()
	}
	qc := b.vmConfig(k.boot, base, cid, "AIRLOCK_BARE=1")
	if err := b.confine(&qc); err != nil { // as boxes start: confined unless AIRLOCK_CONFINE=off
		return err
	}
	t0 := time.Now()
	pid, err := qemu.Launch(ctx, qc)
	if err != nil {
		return err
	}
	start := qemu.StartTime(pid)
	for {
		c, _ := os.ReadFile(qc.ConsoleLog)
		if strings.Contains(string(c), "AIRLOCK-BARE-MARKER") {
			break
		}
		if time.Since(t0) > 2*time.Minute || !qemu.Alive(pid, start) {
			qemu.Kill(pid, start)
			return fmt.Errorf("bare init printed no marker; console:\n%s", c)
		}
		time.Sleep(2 * time.Millisecond)
	}
	k.bare = append(k.bare, time.Since(t0))
	time.Sleep(time.Second)
	k.bareRSS = append(k.bareRSS, procStatus(pid, "VmRSS"))
	k.barePeak = append(k.barePeak, procStatus(pid, "VmHWM"))
	qemu.Kill(pid, start)
	b.vmGone()
	b.remove(ctx, true)

	// Cold start: Create -> first Exec("true").
	t0 = time.Now()
	b, err = r.Create(ctx, opts)
	if err != nil {
		return err
	}
	if _, err := b.Exec(ctx, "true", nil, ExecOptions{}); err != nil {
		b.remove(ctx, true)
		return err
	}
	k.cold = append(k.cold, time.Since(t0))
	time.Sleep(time.Second)
	b.mu.Lock()
	qpid := b.rec.PID
	b.mu.Unlock()
	k.idle = append(k.idle, procStatus(qpid, "VmRSS"))
	for j := 0; j < 10; j++ {
		res, err := b.Exec(ctx, "true", nil, ExecOptions{})
		if err != nil {
			b.remove(ctx, true)
			return err
		}
		k.rt = append(k.rt, res.Duration)
		k.guest = append(k.guest, res.GuestDuration)
	}
	k.peak = append(k.peak, procStatus(qpid, "VmHWM"))
	b.remove(ctx, true)

	// First python3 -c output.
	t0 = time.Now()
	b, err = r.Create(ctx, opts)
	if err != nil {
		return err
	}
	res, err := b.Exec(ctx, "python3", []string{"-c", "print(1)"}, ExecOptions{})
	if err != nil || string(res.Stdout) != "1\n" {
		b.remove(ctx, true)
		return fmt.Errorf("python3 -c: %v %v", res, err)
	}
	k.py = append(k.py, time.Since(t0))
	b.remove(ctx, true)
	k.logf("  %s run %d: bare %s, cold start %s, first python %s, peak RSS %d MiB", k.kb.Kind, i+1,
		k.bare[i].Round(time.Millisecond), k.cold[i].Round(time.Millisecond), k.py[i].Round(time.Millisecond), k.peak[i]>>10)
	return nil
}

func (k *kernelRuns) summary() KernelBench {
	kb := k.kb
	kb.Bare, kb.ColdStart, kb.FirstPython = median(k.bare), median(k.cold), median(k.py)
	kb.ExecRoundTrip, kb.GuestExec = median(k.rt), median(k.guest)
	kb.BareRSS, kb.BarePeakRSS, kb.IdleRSS, kb.PeakRSS = medianInt(k.bareRSS), medianInt(k.barePeak), medianInt(k.idle), medianInt(k.peak)
	return kb
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// vs formats a ratio with its target: "1.08 (≤1.05 missed)".
func vs(a, b float64, target float64, atMost bool) string {
	if b == 0 {
		return "-"
	}
	r := a / b
	met := r <= target
	op := "≤"
	if !atMost {
		met, op = r >= target, "≥"
	}
	word := "met"
	if !met {
		word = "missed"
	}
	return fmt.Sprintf("%.2f (%s%.2f %s)", r, op, target, word)
}

// Write prints the report as tables with the ratios the targets refer to.
func (rep *BenchReport) Write(w io.Writer) {
	fmt.Fprintf(w, "accelerator: %s, medians of %d runs\n\n", rep.Accel, rep.Runs)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "kernel\tbare limit\tcold start\tcold/bare\texec rtt\tguest exec\trtt-guest (target ≤1ms)\tidle RSS\tbare RSS\tidle/bare")
	for _, k := range rep.Kernels {
		over := k.ExecRoundTrip - k.GuestExec
		word := "met"
		if over > time.Millisecond {
			word = "missed"
		}
		fmt.Fprintf(tw, "%s %s\t%s\t%s\t%s\t%s\t%s\t%s %s\t%d MiB\t%d MiB\t%s\n", k.Kind, k.Version,
			k.Bare.Round(time.Millisecond), k.ColdStart.Round(time.Millisecond), vs(float64(k.ColdStart), float64(k.Bare), 1.10, true),
			k.ExecRoundTrip.Round(10*time.Microsecond), k.GuestExec.Round(10*time.Microsecond),
			over.Round(10*time.Microsecond), word,
			k.IdleRSS>>10, k.BareRSS>>10, vs(float64(k.IdleRSS), float64(k.BareRSS), 1.05, true))
	}
	tw.Flush()
	if len(rep.Kernels) >= 2 {
		a, d := rep.Kernels[0], rep.Kernels[1]
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		an, dn := a.Kind, d.Kind
		if an == dn { // two builds of one kind: name them by file
			an, dn = filepath.Base(a.Kernel), filepath.Base(d.Kernel)
		}
		fmt.Fprintln(tw, "\t"+an+"\t"+dn+"\tratio")
		fmt.Fprintf(tw, "cold start (create → exec true)\t%s\t%s\t%s\n", a.ColdStart.Round(time.Millisecond), d.ColdStart.Round(time.Millisecond), vs(float64(d.ColdStart), float64(a.ColdStart), 2.5, false))
		fmt.Fprintf(tw, "first python3 -c output\t%s\t%s\t%s\n", a.FirstPython.Round(time.Millisecond), d.FirstPython.Round(time.Millisecond), ratio(float64(d.FirstPython), float64(a.FirstPython)))
		fmt.Fprintf(tw, "QEMU peak RSS (box)\t%d MiB\t%d MiB\t%s\n", a.PeakRSS>>10, d.PeakRSS>>10, vs(float64(a.PeakRSS), float64(d.PeakRSS), 0.55, true))
		tw.Flush()
	}
}
