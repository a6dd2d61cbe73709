package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/boxvm"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/netstack/helper"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// BootTimeout bounds how long a start waits for the agent after launching
// the machine. TCG boots take seconds, more when many boxes boot at once.
const BootTimeout = 120 * time.Second

// Box is one box's engine: its id and directory, the store of its record,
// the driver of its machine, its boot's session and the ports its runtime
// holds for it. What the box is comes in through Host.
type Box struct {
	ID, Dir string
	DB      *store.DB
	Drv     vmm.Driver
	VM      *boxvm.Session
	Held    *Ports
	Host    Host
}

// Host is what the engine asks the box it runs (the root package's Box).
type Host interface {
	// Spec is the machine of the box as rec records it, its disks not
	// named (what Attach, Stop and KillStray take).
	Spec(rec *store.Box) vmm.Spec
	// StoreErr is the error of a failed read of the box's record.
	StoreErr(err error) error
	// Forget drops the runtime's handle of the box, once it is removed.
	Forget()
}

// Lock takes the box's lock (boxdir.LockBox), held by a start, a stop, a
// removal and a save.
func (b *Box) Lock(ctx context.Context) (func(), error) {
	unlock, err := boxdir.LockBox(ctx, b.Dir)
	if err != nil {
		return nil, fmt.Errorf("lock box %s: %w", b.ID, err)
	}
	return unlock, nil
}

// Machine is the recorded boot of rec (it may have ended).
func (b *Box) Machine(rec *store.Box) vmm.Machine {
	return b.Drv.Attach(b.Host.Spec(rec), boxvm.Handle(rec))
}

// StopNet stops the box's network helper, if one runs.
func (b *Box) StopNet() { helper.Stop(b.Dir) }

// Net is the network helper of a box with a network: its options, the
// policy it enforces and the ports it publishes, held by the runtime
// first when Hold is set (an IdleSuspend box's: they stay bound while it
// is suspended, and the helper inherits them).
type Net struct {
	Options helper.Options
	Policy  netstack.Policy
	Publish []netstack.Publish
	Hold    bool
}

// StartNet launches the box's network helper as n says (helper.Start),
// before its machine: it binds the published ports, then connects to the
// machine's network socket once the machine has made it. For n nil (no
// network) none runs: one left is stopped and its ports file removed.
func (b *Box) StartNet(n *Net) (*helper.Starting, error) {
	if n == nil {
		b.StopNet()
		os.Remove(filepath.Join(b.Dir, boxdir.NetPorts))
		return nil, nil
	}
	if n.Hold && len(n.Publish) > 0 {
		var err error
		if n.Options.Held, err = b.Held.Hold(b.ID, b.Dir, n.Publish); err != nil {
			return nil, fmt.Errorf("box %s network: %w", b.ID, err)
		}
	}
	return helper.Start(helper.Box{ID: b.ID, Dir: b.Dir}, n.Options, n.Policy, n.Publish)
}

// Launch is what a start of the box needs beside its record.
type Launch struct {
	// Spec is the machine to start, its disks not named yet.
	Spec vmm.Spec
	// Begin, when set, is called as the start begins (past a box that
	// runs and the previous boot's watcher); the func it returns gets the
	// start's outcome.
	Begin func() (end func(error))
	// Prepare makes what the start needs before it takes its room under
	// the host caps (the image resolved, named volumes made), and returns
	// what names the disks (called with the room held).
	Prepare func(ctx context.Context) (disks func(context.Context) (vmm.Disks, error), err error)
	// Reserve holds the start's room under the host caps until its
	// machine runs (launched, called once that is so and again at the
	// end: a no-op then).
	Reserve func(ctx context.Context) (launched func(), err error)
	// Net launches the box's network helper (nil: none) before the
	// machine: it binds the published ports, then connects to the
	// machine's network socket.
	Net func() (*helper.Starting, error)
	// Machine starts the machine (a boot, or a restore of saved state).
	Machine func(ctx context.Context, spec vmm.Spec) (vmm.Machine, error)
	// Keep, when set, makes the machine end with this process (a warm
	// pool's box, until a claim hands it on).
	Keep func(h vmm.Handle) error
	// Running is told the record of the boot, once it is stored.
	Running func(rec *store.Box)
	// Ready runs once the agent answers (the box's CA installed); its
	// error fails the start.
	Ready func(ctx context.Context) error
	// IsDeath reports whether err, the session's, is a death of the
	// machine (the caller's public error), which the start returns as it
	// is.
	IsDeath func(err error) bool
}

// Start starts the box of rec, its lock held, as l says, unless it runs
// (then it connects to its agent), and waits for its agent: a start that
// fails kills the machine, stops the network helper and records the box
// stopped.
func (b *Box) Start(ctx context.Context, rec *store.Box, l Launch) (err error) {
	if boxvm.Running(rec) {
		_, err := b.VM.Client(ctx)
		return err
	}
	// An earlier boot that ended (killed, say) is handled by its watcher
	// first: its death recorded against that boot, not taken for this
	// one's.
	if err := b.VM.WaitWatcher(ctx, 5*time.Second); err != nil {
		return err
	}
	if l.Begin != nil {
		if end := l.Begin(); end != nil {
			defer func() { end(err) }()
		}
	}
	disks, err := l.Prepare(ctx)
	if err != nil {
		return err
	}
	launched, err := l.Reserve(ctx)
	if err != nil {
		return err
	}
	defer launched()
	spec := l.Spec
	if spec.Disks, err = disks(ctx); err != nil {
		return fmt.Errorf("box %s: %w", b.ID, err)
	}
	nh, err := l.Net()
	if err != nil {
		return err
	}
	stopNet := func() {
		nh.Joined()
		b.StopNet()
	}
	m, err := l.Machine(ctx, spec)
	launched()
	if err != nil {
		stopNet()
		return fmt.Errorf("box %s: %w", b.ID, err)
	}
	if l.Keep != nil {
		if h := m.Handle(); h.PID > 0 {
			if err := l.Keep(h); err != nil {
				m.Kill()
				stopNet()
				return fmt.Errorf("box %s: %w", b.ID, err)
			}
		}
	}
	if err := nh.Wait(ctx); err != nil {
		m.Kill()
		stopNet()
		return err
	}
	h, now := m.Handle(), time.Now()
	if err := b.DB.SetRunning(ctx, b.ID, h.PID, h.Start, now); err != nil {
		m.Kill()
		stopNet()
		return fmt.Errorf("box %s: record it running: %w", b.ID, err)
	}
	up := *rec
	up.State, up.PID, up.PIDStart, up.Started = store.StateRunning, h.PID, h.Start, now
	l.Running(&up)
	b.VM.Begin()
	cctx, cancel := context.WithTimeout(ctx, BootTimeout)
	defer cancel()
	if _, err := b.VM.Client(cctx); err != nil {
		m.Kill()
		stopNet()
		b.DB.SetStopped(context.WithoutCancel(ctx), b.ID)
		if l.IsDeath(err) {
			return err
		}
		return fmt.Errorf("box %s did not come up: %w\n--- console (last lines) ---\n%s", b.ID, err, m.Console(20))
	}
	if err := l.Ready(cctx); err != nil {
		m.Kill()
		stopNet()
		b.DB.SetStopped(context.WithoutCancel(ctx), b.ID)
		return err
	}
	return nil
}

// Stop stops the box of rec (its lock held): its agent is asked to shut
// down, then its machine told to quit, then killed, after grace in all
// (vmm.Stop); stopping is called first when it runs. Its network
// helper stops and its record says stopped. was is whether it ran.
func (b *Box) Stop(ctx context.Context, rec *store.Box, grace time.Duration, stopping func()) (was bool, err error) {
	b.VM.Stopping()
	if was = boxvm.Running(rec); was {
		stopping()
		m := b.Machine(rec)
		if err := vmm.Stop(ctx, m, grace, func(ctx context.Context) {
			if c, err := b.VM.Client(ctx); err == nil {
				c.Shutdown(ctx)
			}
		}); err != nil {
			b.StopNet()
			return false, fmt.Errorf("box %s: %w", b.ID, err)
		}
		m.Release()
	}
	b.VM.DropConn()
	b.StopNet()
	if err := b.DB.SetStopped(ctx, b.ID); err != nil {
		return false, fmt.Errorf("box %s: record it stopped: %w", b.ID, err)
	}
	return was, nil
}

// Remove removes the box: its machine (killed, after running is told,
// whose error refuses the removal: a running box without force), a
// machine no record names (vmm.StrayKiller), its network helper, the
// ports held for it, its record and its directory. gone says the record
// was deleted: the box is, whatever is left of its directory (err).
func (b *Box) Remove(ctx context.Context, running func(rec *store.Box) error) (gone bool, err error) {
	if _, err := os.Stat(b.Dir); err == nil {
		unlock, err := b.Lock(ctx)
		if err != nil {
			return false, err
		}
		defer unlock()
	}
	rec, err := b.DB.Get(ctx, b.ID)
	if err != nil {
		return false, b.Host.StoreErr(err)
	}
	if boxvm.Running(rec) {
		if err := running(rec); err != nil {
			return false, err
		}
		b.VM.Stopping()
		b.VM.DropConn()
		if err := b.Machine(rec).Kill(); err != nil {
			b.StopNet()
			return false, fmt.Errorf("box %s: %w", b.ID, err)
		}
	}
	// A machine no record names (a start cut short before its record)
	// goes before the record does.
	if sk, ok := b.Drv.(vmm.StrayKiller); ok {
		if err := sk.KillStray(b.Host.Spec(rec)); err != nil {
			b.StopNet()
			return false, err
		}
	}
	b.StopNet()
	b.Held.Release(b.ID)
	b.VM.DropConn()
	if err := b.DB.Delete(ctx, b.ID); err != nil {
		return false, fmt.Errorf("box %s: delete its record: %w", b.ID, err)
	}
	os.RemoveAll(boxdir.ShortDir(b.ID))
	b.Host.Forget()
	return true, boxdir.RemoveBox(b.Dir)
}

// Disks names the root filesystem disks of a box in dir, of img, for a
// driver that boots from disks (vmm.DiskBooter; none for others): the
// image's base, built first when the cache (cacheDir) lacks it
// (internal/rootfs: a check of its superblock when it is there), and
// where the box's writable layer is (boxdir.RW, the name every release
// used).
func Disks(ctx context.Context, drv vmm.Driver, images *image.Store, img *image.Image, cacheDir, dir string) (vmm.Disks, error) {
	if d, ok := drv.(vmm.DiskBooter); !ok || !d.BootsFromDisks() {
		return vmm.Disks{}, nil
	}
	base, err := rootfs.Base(ctx, images, img, cacheDir)
	if err != nil {
		return vmm.Disks{}, fmt.Errorf("root filesystem for %s: %w", img.Ref, err)
	}
	return vmm.Disks{Base: base, Layer: filepath.Join(dir, boxdir.RW)}, nil
}

// Create prepares the box directory for machine spec: its disks (named
// by disks), then the driver's Create for a new box, with an empty
// writable layer of spec.DiskSizeMiB (rootfs.NewDisk, cacheDir holding
// its template), or prepare when it is set (a restore or an import,
// which fill the layer).
func (b *Box) Create(ctx context.Context, spec vmm.Spec, disks func(context.Context) (vmm.Disks, error), cacheDir string, prepare func(context.Context, vmm.Spec) error) (err error) {
	if err := os.MkdirAll(b.Dir, 0o700); err != nil {
		return fmt.Errorf("box %s: %w", b.ID, err)
	}
	if spec.Disks, err = disks(ctx); err != nil {
		return fmt.Errorf("box %s: %w", b.ID, err)
	}
	if prepare == nil {
		if spec.Disks.Layer != "" {
			if err := rootfs.NewDisk(spec.Disks.Layer, spec.DiskSizeMiB, cacheDir); err != nil {
				return fmt.Errorf("box %s: %w", b.ID, err)
			}
		}
		prepare = b.Drv.Create
	}
	if err := prepare(ctx, spec); err != nil {
		return fmt.Errorf("box %s: %w", b.ID, err)
	}
	return nil
}

// Observe marks rec, of the box in dir, stopped when it says running
// but its machine is gone (what the gone boot held, its cgroup,
// released; gone records why it ended), and returns the record as it now
// is.
func Observe(ctx context.Context, db *store.DB, drv vmm.Driver, dir string, rec *store.Box, gone func(*store.Box)) (*store.Box, error) {
	if rec.State != store.StateRunning || boxvm.Running(rec) {
		return rec, nil
	}
	drv.Attach(vmm.Spec{ID: rec.ID, Dir: dir}, boxvm.Handle(rec)).Release()
	if err := db.SetStoppedIfPID(ctx, rec.ID, rec.PID); err != nil {
		return nil, fmt.Errorf("box %s: record it stopped: %w", rec.ID, err)
	}
	gone(rec)
	up := *rec
	up.State, up.PID, up.PIDStart = store.StateStopped, 0, 0
	return &up, nil
}

// SetPolicy gives the network helper of the box of rec, when it runs,
// policy pol at once; none says the box's new mode is none. A box that
// runs without a network device (started with mode none; the NIC of a
// boot is there when its helper runs) gets one only at its next start:
// refused, unless none.
func (b *Box) SetPolicy(ctx context.Context, rec *store.Box, pol netstack.Policy, none bool) error {
	if !boxvm.Running(rec) {
		return nil
	}
	if _, nic := helper.PID(b.Dir); !nic {
		if none {
			return nil
		}
		return fmt.Errorf("box %s was started without a network device: stop it, then set its network and start it again", b.ID)
	}
	if _, err := helper.Call(ctx, helper.Box{ID: b.ID, Dir: b.Dir}, netstack.Request{Op: "policy", Policy: &pol}); err != nil {
		return fmt.Errorf("box %s: set network policy: %w", b.ID, err)
	}
	return nil
}
