package airlock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/fake"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// driverHarness is what the lifecycle suite needs from a VM driver's test
// setup: runtimes on a home, an image to create boxes from, and what words
// a machine's unexpected death is described with.
type driverHarness struct {
	// open opens a runtime on home ("" for a fresh one); several runtimes
	// on one home stand for several processes.
	open func(t *testing.T, home string) *airlock.Runtime
	// openOpts opens a runtime on a fresh home with o's other settings.
	openOpts func(t *testing.T, o airlock.Options) *airlock.Runtime
	image    string
	// died is a word the cause of a killed machine names ("QEMU").
	died string
}

// fakeHarness runs the suite on the fake driver: the real guest agent as a
// host process. It needs no QEMU, kernel or image build.
func fakeHarness(t *testing.T) driverHarness {
	return fakeHarnessOn(t, fake.New(os.Getenv("AIRLOCK_AGENT"))) // built by vmtest.Main
}

// fakeHarnessOn is fakeHarness on a fake driver set up by the caller.
func fakeHarnessOn(t *testing.T, drv vmm.Driver) driverHarness {
	const ref = "test/fake:v1"
	images := fakeImageStore(t, ref)
	openOpts := func(t *testing.T, o airlock.Options) *airlock.Runtime {
		t.Helper()
		if o.Home == "" {
			o.Home = t.TempDir()
		}
		o.ImagesDir, o.CacheDir, o.Warn = images, t.TempDir(), func(string) {}
		r, err := airlock.OpenWithDriver(o, drv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	return driverHarness{
		open: func(t *testing.T, home string) *airlock.Runtime {
			return openOpts(t, airlock.Options{Home: home})
		},
		openOpts: openOpts,
		image:    ref,
		died:     "agent process",
	}
}

func qemuHarness(t *testing.T) driverHarness {
	openOpts := func(t *testing.T, o airlock.Options) *airlock.Runtime {
		t.Helper()
		o.Home, o.ImagesDir, o.Warn = t.TempDir(), vmtest.ImagesDir(), func(string) {}
		r, err := airlock.Open(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	return driverHarness{open: openRuntime, openOpts: openOpts, image: vmtest.DefaultImage, died: "QEMU"}
}

// TestLifecycleFake runs the lifecycle suite without VMs, always.
func TestLifecycleFake(t *testing.T) { testLifecycle(t, fakeHarness(t)) }

// TestLifecycleQEMU runs the same suite on real VMs.
func TestLifecycleQEMU(t *testing.T) {
	vmtest.Require(t)
	testLifecycle(t, qemuHarness(t))
}

// testLifecycle is the behaviour every VM driver must give the lifecycle
// code: one suite, run against each driver (as containerd's snapshotter
// test suite is).
func testLifecycle(t *testing.T, h driverHarness) {
	ctx := context.Background()
	create := func(t *testing.T, r *airlock.Runtime, o airlock.BoxOptions) *airlock.Box {
		t.Helper()
		o.Image = h.image
		b, err := r.Create(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })
		return b
	}
	sh := func(t *testing.T, b *airlock.Box, script string) string {
		t.Helper()
		res, err := b.Exec(ctx, "sh", []string{"-c", script}, airlock.ExecOptions{})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("exec %q: exit %d, stderr %q", script, res.ExitCode, res.Stderr)
		}
		return string(res.Stdout)
	}
	pidGone := func(t *testing.T, pid int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil || strings.Contains(string(b), ") Z ") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("machine process %d still runs", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	t.Run("host capacity caps", func(t *testing.T) {
		// A box whose memory alone passes the memory cap is refused at
		// creation and leaves no record.
		r := h.openOpts(t, airlock.Options{MaxMemoryMiB: 1024})
		_, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, MemoryMiB: 2048})
		var ce *airlock.CapacityError
		if !errors.As(err, &ce) || ce.Cap != "AIRLOCK_MAX_MEMORY" || ce.Limit != 1024 || !strings.Contains(err.Error(), "MaxMemoryMiB") {
			t.Fatalf("memory above the cap: %v", err)
		}
		if boxes, _ := r.List(ctx); len(boxes) != 0 {
			t.Fatalf("refused box left a record: %+v", boxes)
		}
		// The running-box cap counts the driver's machines host-wide:
		// other boxes may run here (other tests), and then the cap of 1
		// is reached already; if none runs, the first box fits, a second
		// does not, and the first, stopped, starts again.
		r = h.openOpts(t, airlock.Options{MaxBoxes: 1})
		b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Network: airlock.NetworkDisabled})
		if err == nil {
			t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })
			var c *airlock.Box
			c, err = r.Create(ctx, airlock.BoxOptions{Image: h.image, Network: airlock.NetworkDisabled})
			if err == nil {
				c.Remove(ctx, true)
			}
		}
		if !errors.As(err, &ce) || ce.Cap != "AIRLOCK_MAX_BOXES" || ce.Limit != 1 || !strings.Contains(err.Error(), "MaxBoxes") {
			t.Fatalf("box over the running-box cap: %v", err)
		}
		if b != nil {
			if err := b.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.Start(ctx); err != nil {
				var ce *airlock.CapacityError
				if !errors.As(err, &ce) { // another test's box may have started meanwhile
					t.Fatalf("restart under the cap: %v", err)
				}
			}
		}
	})

	t.Run("create exec stop start remove", func(t *testing.T) {
		r := h.open(t, "")
		b := create(t, r, airlock.BoxOptions{Name: "cycle", Env: []string{"BOXVAR=b"}})
		if got := sh(t, b, `echo "$BOXVAR"; exit 0`); got != "b\n" {
			t.Fatalf("env: %q", got)
		}
		res, err := b.Exec(ctx, "sh", []string{"-c", "echo out; echo err >&2; exit 3"}, airlock.ExecOptions{})
		if err != nil || res.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
			t.Fatalf("exit status: %+v %v", res, err)
		}
		info, err := b.Info(ctx)
		if err != nil || info.State != "running" || info.PID == 0 || info.Name != "cycle" {
			t.Fatalf("info of a running box: %+v %v", info, err)
		}
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		pidGone(t, info.PID)
		stopped, _ := b.Info(ctx)
		if stopped.State != "stopped" || stopped.PID != 0 {
			t.Fatalf("info after stop: %+v", stopped)
		}
		if e, ok := exitOf(stopped); !ok || e.Reason != airlock.ExitStopped || !e.Boot.Equal(info.Started) {
			t.Fatalf("exit state after Stop: %+v %v (boot %v)", e, ok, info.Started)
		}
		if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); !errors.Is(err, airlock.ErrBoxNotRunning) {
			t.Fatalf("exec on a stopped box: %v", err)
		}
		if err := b.Stop(ctx); err != nil {
			t.Fatalf("stopping a stopped box: %v", err)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, b, "echo again"); got != "again\n" {
			t.Fatalf("after restart: %q", got)
		}
		if info, _ := b.Info(ctx); !info.Started.After(stopped.Started) {
			t.Fatalf("restart did not record a new boot: %v then %v", stopped.Started, info.Started)
		} else if e, ok := exitOf(info); ok {
			t.Fatalf("a running box has an exit state: %+v", e)
		}
		// Rename: the box is found by its new name only; a taken name is
		// refused.
		if err := b.Rename(ctx, "cycled"); err != nil {
			t.Fatal(err)
		}
		if g, err := r.Get(ctx, "cycled"); err != nil || g.ID() != b.ID() || b.Name() != "cycled" {
			t.Fatalf("get by the new name: %v, name %q", err, b.Name())
		}
		if _, err := r.Get(ctx, "cycle"); !errors.Is(err, airlock.ErrBoxNotFound) {
			t.Fatalf("the old name still finds the box: %v", err)
		}
		other := create(t, r, airlock.BoxOptions{Name: "other", Network: airlock.NetworkDisabled})
		if err := other.Rename(ctx, "cycled"); !errors.Is(err, airlock.ErrNameInUse) {
			t.Fatalf("rename to a taken name: %v", err)
		}
		// Names follow Docker's rule: these are refused, and make no box.
		for _, bad := range []string{"bad/name", "-dash", "sp ace", ".dot", "new\nline", strings.Repeat("n", airlock.MaxNameLen+1)} {
			if err := other.Rename(ctx, bad); !errors.Is(err, airlock.ErrInvalidArgument) {
				t.Errorf("rename to %q: %v, want ErrInvalidArgument", bad, err)
			}
			if nb, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Name: bad}); !errors.Is(err, airlock.ErrInvalidArgument) {
				t.Errorf("create named %q: %v, want ErrInvalidArgument", bad, err)
				if nb != nil {
					nb.Remove(ctx, true)
				}
			}
		}
		if other.Name() != "other" {
			t.Errorf("a refused rename changed the name to %q", other.Name())
		}
		// StopTimeout 0 does not wait for a clean shutdown.
		oi, _ := other.Info(ctx)
		if err := other.Stop(ctx, airlock.StopOptions{Grace: -1}); err != nil {
			t.Fatal(err)
		}
		pidGone(t, oi.PID)
		oi, _ = other.Info(ctx)
		if e, ok := exitOf(oi); !ok || e.Reason != airlock.ExitStopped {
			t.Fatalf("exit state after StopTimeout 0: %+v %v", e, ok)
		}
		if err := r.Remove(ctx, other.ID(), false); err != nil {
			t.Fatal(err)
		}
		if err := b.Rename(ctx, "cycle"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Name: "cycle"}); !errors.Is(err, airlock.ErrNameInUse) {
			t.Fatalf("second box with the same name: %v", err)
		}
		info, _ = b.Info(ctx)
		if err := r.Remove(ctx, "cycle", false); !errors.Is(err, airlock.ErrBoxRunning) {
			t.Fatalf("remove of a running box without force: %v", err)
		}
		if err := r.Remove(ctx, "cycle", true); err != nil {
			t.Fatal(err)
		}
		pidGone(t, info.PID)
		if _, err := r.Get(ctx, "cycle"); !errors.Is(err, airlock.ErrBoxNotFound) {
			t.Fatalf("get after remove: %v", err)
		}
		if list, _ := r.List(ctx); len(list) != 0 {
			t.Fatalf("boxes left: %+v", list)
		}
	})

	t.Run("death while an exec is pending", func(t *testing.T) {
		r := h.open(t, "")
		b := create(t, r, airlock.BoxOptions{Network: airlock.NetworkDisabled})
		info, _ := b.Info(ctx)
		p, err := b.ExecStream(ctx, "sleep", []string{"600"}, airlock.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		killed := time.Now()
		syscall.Kill(info.PID, syscall.SIGKILL)
		_, err = p.Wait()
		if d := time.Since(killed); d > 3*time.Second {
			t.Fatalf("pending exec took %s to fail", d)
		}
		if !errors.Is(err, airlock.ErrBoxDied) || !strings.Contains(err.Error(), h.died) {
			t.Fatalf("pending exec: %v", err)
		}
		start := time.Now()
		if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); err == nil || time.Since(start) > 3*time.Second {
			t.Fatalf("exec after death: %v after %s", err, time.Since(start))
		}
		list, _ := r.List(ctx)
		if len(list) != 1 || list[0].State != "stopped" {
			t.Fatalf("box not marked stopped: %+v", list)
		}
		if e, ok := exitOf(list[0]); !ok || e.Reason != airlock.ExitVMDied || !strings.Contains(e.Cause, h.died) {
			t.Fatalf("exit state of a machine that died: %+v %v", e, ok)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatalf("restart after death: %v", err)
		}
		if got := sh(t, b, "echo back"); got != "back\n" {
			t.Fatalf("after restart: %q", got)
		}
	})

	t.Run("reconcile after a crash", func(t *testing.T) {
		home := t.TempDir()
		r1 := h.open(t, home)
		alive := create(t, r1, airlock.BoxOptions{Name: "alive"})
		dead := create(t, r1, airlock.BoxOptions{Name: "dead"})
		// The process holding r1 "crashes": nothing is closed or stopped.
		// Meanwhile one machine dies where no one watches it.
		di, _ := dead.Info(ctx)
		syscall.Kill(di.PID, syscall.SIGKILL)
		pidGone(t, di.PID)
		r2 := h.open(t, home)
		states := map[string]airlock.BoxState{}
		list, err := r2.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, bi := range list {
			states[bi.Name] = bi.State
		}
		if states["alive"] != "running" || states["dead"] != "stopped" {
			t.Fatalf("after reopening: %v", states)
		}
		// Why the dead box stopped is recorded (by the runtime watching its
		// machine, or the one that found it gone).
		for _, bi := range list {
			e, ok := exitOf(bi)
			if bi.Name == "alive" && ok {
				t.Fatalf("running box with an exit state: %+v", e)
			}
			if bi.Name == "dead" && (!ok || e.Reason != airlock.ExitVMDied || !strings.Contains(e.Cause, h.died)) {
				t.Fatalf("exit state of the box that died unwatched: %+v %v", e, ok)
			}
		}
		// A new process reaches the box the old one started, and can start
		// the dead one again.
		a2, err := r2.Get(ctx, "alive")
		if err != nil {
			t.Fatal(err)
		}
		if got := sh(t, a2, "echo reached"); got != "reached\n" {
			t.Fatalf("box started by another runtime: %q", got)
		}
		d2, err := r2.Get(ctx, "dead")
		if err != nil {
			t.Fatal(err)
		}
		if err := d2.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, d2, "echo restarted"); got != "restarted\n" {
			t.Fatalf("restarted box: %q", got)
		}
		// The first runtime's handle follows: the box it started is still
		// running and answers it too.
		if got := sh(t, alive, "echo first"); got != "first\n" {
			t.Fatalf("first handle: %q", got)
		}
	})

	t.Run("concurrent get stop remove", func(t *testing.T) {
		home := t.TempDir()
		r := h.open(t, home)
		b := create(t, r, airlock.BoxOptions{Name: "busy"})
		other := h.open(t, home) // another process on the same home
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		expected := func(err error) bool {
			return err == nil || errors.Is(err, airlock.ErrBoxNotFound) || errors.Is(err, airlock.ErrBoxNotRunning) ||
				errors.Is(err, airlock.ErrBoxDied)
		}
		stopDone := make(chan struct{})
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				rt := r
				if i%2 == 1 {
					rt = other
				}
				for {
					select {
					case <-stopDone:
						return
					default:
					}
					g, err := rt.Get(ctx, "busy")
					if err != nil {
						if !expected(err) {
							errs <- fmt.Errorf("get: %w", err)
						}
						return
					}
					_ = g.Name()
					if _, err := g.Info(ctx); !expected(err) {
						errs <- fmt.Errorf("info: %w", err)
					}
					if _, err := g.Exec(ctx, "true", nil, airlock.ExecOptions{}); !expected(err) {
						errs <- fmt.Errorf("exec: %w", err)
					}
				}
			}(i)
		}
		time.Sleep(200 * time.Millisecond)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Stop(ctx); err != nil {
				errs <- fmt.Errorf("stop: %w", err)
			}
			if err := other.Remove(ctx, "busy", true); err != nil && !errors.Is(err, airlock.ErrBoxNotFound) {
				errs <- fmt.Errorf("remove: %w", err)
			}
			close(stopDone)
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if _, err := r.Get(ctx, "busy"); !errors.Is(err, airlock.ErrBoxNotFound) {
			t.Fatalf("get after remove: %v", err)
		}
		if _, err := os.Stat(filepath.Join(home, "boxes", b.ID())); !os.IsNotExist(err) {
			t.Fatalf("box directory left: %v", err)
		}
	})
}

// A box whose stored configuration is broken is listed, Get says why, and
// it can still be removed.
func TestUnreadableRecord(t *testing.T) {
	h := fakeHarness(t)
	home := t.TempDir()
	r := h.open(t, home)
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Name: "broken"})
	if err != nil {
		t.Fatal(err)
	}
	info, _ := b.Info(ctx)
	db, err := sql.Open("sqlite", filepath.Join(home, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE boxes SET config = '{"v":1,"network":"sideways"}' WHERE id = ?`, b.ID()); err != nil {
		t.Fatal(err)
	}
	db.Close()
	r2 := h.open(t, home)
	if list, err := r2.List(ctx); err != nil || len(list) != 1 || list[0].Name != "broken" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if _, err := r2.Get(ctx, "broken"); err == nil || !strings.Contains(err.Error(), "cannot be read") || errors.Is(err, airlock.ErrBoxNotFound) {
		t.Fatalf("get: %v", err)
	}
	if err := r2.Remove(ctx, "broken", true); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", info.PID)); err == nil {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", info.PID)); !strings.Contains(string(b), ") Z ") {
			t.Errorf("machine %d left running", info.PID)
		}
	}
	if list, _ := r2.List(ctx); len(list) != 0 {
		t.Fatalf("after remove: %+v", list)
	}
}

// A store failure is not "box not found": it keeps its cause and names the
// box.
func TestStoreErrorsKeepTheirCause(t *testing.T) {
	h := fakeHarness(t)
	r := h.open(t, "")
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Name: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(context.Background(), true)
	if _, err := r.Get(ctx, "missing"); !errors.Is(err, airlock.ErrBoxNotFound) {
		t.Fatalf("missing box: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.Get(cctx, "kept")
	if err == nil || errors.Is(err, airlock.ErrBoxNotFound) || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "kept") {
		t.Fatalf("store error: %v", err)
	}
	if _, err := b.Info(cctx); err == nil || errors.Is(err, airlock.ErrBoxNotFound) || !strings.Contains(err.Error(), b.ID()) {
		t.Fatalf("store error from Info: %v", err)
	}
}

// TestNetHelperFollowsTheMachine runs a box's network helper on the fake
// driver (a NIC socket with no guest behind it: no traffic, but the same
// lifecycle as under QEMU): it binds the published port and answers on its
// control socket while the machine runs, and goes with Stop, with the
// machine's death, with Open's reconcile of an orphan, and with Remove.
func TestNetHelperFollowsTheMachine(t *testing.T) {
	h := fakeHarness(t)
	home := t.TempDir()
	r := h.open(t, home)
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Ports: []airlock.PortMapping{{GuestPort: 8000}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(ctx, true)
	helper := func() int {
		raw, err := os.ReadFile(filepath.Join(home, "boxes", b.ID(), "net.pid"))
		if err != nil {
			return 0
		}
		var pid int
		fmt.Sscan(string(raw), &pid)
		if pid <= 0 || syscall.Kill(pid, 0) != nil {
			return 0
		}
		return pid
	}
	gone := func(pid int) bool {
		for i := 0; i < 100; i++ {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(b), ") Z ") {
				return true
			}
			time.Sleep(20 * time.Millisecond)
		}
		return false
	}
	hp := helper()
	if hp == 0 {
		t.Fatal("no network helper runs for the box")
	}
	ports, err := b.Ports(ctx)
	if err != nil || len(ports) != 1 || ports[0].HostPort == 0 || ports[0].GuestPort != 8000 {
		t.Fatalf("published ports: %+v %v", ports, err)
	}
	if _, err := b.NetworkStats(ctx); err != nil {
		t.Errorf("network stats: %v", err)
	}
	if err := b.SetNetwork(ctx, airlock.NetworkPolicy{AllowNet: []string{"pypi.org"}}); err != nil {
		t.Fatalf("set network of a running box: %v", err)
	}
	if info, _ := b.Info(ctx); info.Options.Network != airlock.NetworkAllowlist || len(info.Options.Ports) != 1 {
		t.Errorf("stored options after SetNetwork: %+v", info.Options)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if !gone(hp) {
		t.Fatalf("helper %d still runs after Stop", hp)
	}
	if ports, _ := b.Ports(ctx); ports != nil {
		t.Errorf("ports of a stopped box: %+v", ports)
	}

	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hp = helper()
	info, _ := b.Info(ctx)
	syscall.Kill(info.PID, syscall.SIGKILL)
	if hp == 0 || !gone(hp) {
		t.Fatalf("helper %d: not there, or still there after the machine was killed", hp)
	}

	// An orphan (stopped, so that it cannot notice its machine go) is
	// killed by the next Open.
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hp = helper()
	syscall.Kill(hp, syscall.SIGSTOP)
	// The stop takes effect thread by thread: wait until the helper is
	// stopped, or it may still see its machine go and end by itself.
	for i := 0; i < 250; i++ {
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", hp)); strings.Contains(string(st), ") T ") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	info, _ = b.Info(ctx)
	syscall.Kill(info.PID, syscall.SIGKILL)
	pidGone := time.Now().Add(5 * time.Second)
	for vmmAlive(info.PID) && time.Now().Before(pidGone) {
		time.Sleep(10 * time.Millisecond)
	}
	if !vmmAlive(hp) {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", hp))
		ne, _ := os.ReadFile(filepath.Join(home, "boxes", b.ID(), "net-helper.log"))
		t.Fatalf("the stopped helper went before any reconcile: %q %q", st, ne)
	}
	h.open(t, home)
	if !gone(hp) {
		syscall.Kill(hp, syscall.SIGKILL)
		t.Fatalf("orphan helper %d survived Open's reconcile", hp)
	}

	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hp = helper()
	if err := b.Remove(ctx, true); err != nil {
		t.Fatal(err)
	}
	if hp == 0 || !gone(hp) {
		t.Fatalf("helper %d: not there, or still there after Remove", hp)
	}
}

// vmmAlive reports whether pid runs (a zombie does not).
func vmmAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !strings.Contains(string(b), ") Z ")
}

// fakeImageStore returns a new image store holding a tiny image (a "sh"
// entrypoint) as ref, for the fake driver's tests.
func fakeImageStore(t testing.TB, ref string) string {
	t.Helper()
	images := t.TempDir()
	s, err := image.Open(images)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteImage(context.Background(), ref, imagetest.Image(t, []string{"sh"}), "test image", nil); err != nil {
		t.Fatal(err)
	}
	return images
}

// exitOf returns info.Exit as the value and whether it is set.
func exitOf(info airlock.BoxInfo) (airlock.ExitState, bool) {
	if info.Exit == nil {
		return airlock.ExitState{}, false
	}
	return *info.Exit, true
}
