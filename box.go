package airlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/boxvm"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/lifecycle"
	"github.com/airlock-run/airlock/internal/lifetime"
	"github.com/airlock-run/airlock/internal/netstack/helper"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// bootTimeout bounds how long Start waits for the agent after launching
// the machine (lifecycle.BootTimeout).
const bootTimeout = lifecycle.BootTimeout

// Box is a handle on one box. Handles are cheap; several processes may hold
// handles on the same box. Methods are safe for concurrent use; several
// Execs may run at once.
type Box struct {
	r   *Runtime
	id  string // immutable
	dir string // immutable

	// mu guards the fields below. rec and cfg are replaced whole, never
	// changed in place: a copy taken under mu stays valid after unlocking.
	mu  sync.Mutex
	rec *store.Box // the record as last read or written by this handle
	cfg boxConfig  // rec's decoded configuration

	// rebind is the ports a rollback's start binds again (Rollback).
	rebind []PortMapping

	// use is the box's use through this handle, for IdleTimeout
	// (lifetime.go).
	use lifetime.Use

	// vm is this handle's view of the box's current boot: the machine it
	// watches, its agent connection, a death, an unhealthy mark
	// (internal/boxvm; vmHost, below, is the box as it sees it).
	vm *boxvm.Session

	// eng is the box's lifecycle engine (internal/lifecycle: start,
	// stop, remove over the record, the driver, vm and the network
	// helper; vmHost is the box as it sees it).
	eng *lifecycle.Box
}

// newBox returns a handle for rec, whose configuration was decoded as cfg.
func newBox(r *Runtime, rec *store.Box, cfg boxConfig) *Box {
	b := &Box{r: r, id: rec.ID, dir: filepath.Join(r.opts.Home, "boxes", rec.ID), rec: rec, cfg: cfg}
	b.vm = boxvm.New(b.id, b.ConsoleLog(), (*vmHost)(b))
	b.eng = &lifecycle.Box{ID: b.id, Dir: b.dir, DB: r.db, Drv: r.drv, VM: b.vm, Held: &r.life.held, Host: (*vmHost)(b)}
	return b
}

// refresh makes rec the handle's record.
func (b *Box) refresh(rec *store.Box) error {
	cfg, err := decodeConfig(rec)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.rec, b.cfg = rec, cfg
	b.mu.Unlock()
	// Another process may have started the box again (Start, Resume)
	// after the boot this handle saw end: that end is history.
	b.vm.Restarted(func() bool { return running(rec) })
	return nil
}

// snapshot returns the handle's record and configuration.
func (b *Box) snapshot() (*store.Box, boxConfig) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rec, b.cfg
}

// load reads the box's record from the store, marks it stopped if its
// machine is gone, and makes it the handle's record.
func (b *Box) load(ctx context.Context) (*store.Box, error) {
	rec, err := b.r.db.Get(ctx, b.id)
	if err != nil {
		return nil, b.r.storeErr(b.id, err)
	}
	if rec, err = b.r.observe(ctx, rec); err != nil {
		return nil, err
	}
	if err := b.refresh(rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// ID returns the box id (12 hex digits).
func (b *Box) ID() string { return b.id }

// Name returns the box name, "" if unnamed.
func (b *Box) Name() string {
	rec, _ := b.snapshot()
	return rec.Name
}

// Info returns the box's current record.
func (b *Box) Info(ctx context.Context) (BoxInfo, error) {
	rec, err := b.load(ctx)
	if err != nil {
		return BoxInfo{}, err
	}
	_, cfg := b.snapshot()
	return b.r.infoOf(rec, cfg), nil
}

// ConsoleLog returns the path of the box's serial console log (kernel and
// agent messages of the current or last boot).
func (b *Box) ConsoleLog() string { return filepath.Join(b.dir, boxdir.Console) }

// specWithDisks returns the machine spec of the box as recorded in rec,
// with its image resolved and its disks named (see disks).
func (b *Box) specWithDisks(ctx context.Context, rec *store.Box) (vmm.Spec, error) {
	img, err := b.image(rec)
	if err != nil {
		return vmm.Spec{}, err
	}
	_, cfg := b.snapshot()
	spec := b.vmSpec(rec, cfg)
	if spec.Disks, err = b.r.disks(ctx, img, b.dir); err != nil {
		return vmm.Spec{}, fmt.Errorf("box %s: %w", b.id, err)
	}
	return spec, nil
}

// disks returns the root filesystem disks of a box in dir, of img
// (lifecycle.Disks): for a driver that boots from disks, the image's
// base, built first when the cache lacks it, and the writable layer.
func (r *Runtime) disks(ctx context.Context, img *image.Image, dir string) (vmm.Disks, error) {
	return lifecycle.Disks(ctx, r.drv, r.images, img, r.opts.CacheDir, dir)
}

// lockLoad takes the box's lock (see lock) and reads its record; the
// caller releases the lock with unlock, also when err is not nil.
func (b *Box) lockLoad(ctx context.Context) (rec *store.Box, unlock func(), err error) {
	unlock, err = b.lock(ctx)
	if err != nil {
		return nil, func() {}, err
	}
	rec, err = b.load(ctx)
	return rec, unlock, err
}

// lock takes the box's lock (boxdir.LockBox), held by Start, Stop and
// Remove.
func (b *Box) lock(ctx context.Context) (func(), error) { return b.eng.Lock(ctx) }

// vmSpec is what the driver makes the box's machine from (without the
// image, which only Create and Start need).
func (b *Box) vmSpec(rec *store.Box, cfg boxConfig) vmm.Spec {
	o := cfg.Options
	return vmm.Spec{ID: b.id, Dir: b.dir, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskSizeMiB: o.DiskSizeMiB,
		Net: b.netSpec(cfg), Hostname: hostname(rec, cfg), Volumes: b.r.vmVolumes(o.Volumes),
		DieWithCaller: diesWithOwner(cfg)}
}

// diesWithOwner reports whether a machine this process starts for the
// box must end when this process does: an AutoRemove box of this
// process, whose record the next Open removes once the process is gone
// (a VM no record lists must not run on). A warm pool's box is not: a
// claim may hand it to a caller as a box that outlives the process; the
// runtime's keeper ends it with the process instead, until then.
func diesWithOwner(cfg boxConfig) bool {
	return cfg.Options.AutoRemove && cfg.OwnerPID == os.Getpid() && cfg.Pool == ""
}

func handleOf(rec *store.Box) vmm.Handle { return boxvm.Handle(rec) }

// running reports whether rec says the box runs and its machine process
// does: the one test of "recorded running but gone" (boxvm.Running).
func running(rec *store.Box) bool { return boxvm.Running(rec) }

// create prepares the box directory: its disks (see disks), then the
// driver's Create for a new box (with an empty writable layer), or prepare
// when it is set (a restore or an import, which fill the layer;
// lifecycle.Box.Create).
func (b *Box) create(ctx context.Context, img *image.Image, prepare func(context.Context, vmm.Spec) error) error {
	rec, cfg := b.snapshot()
	disks := func(ctx context.Context) (vmm.Disks, error) { return b.r.disks(ctx, img, b.dir) }
	return b.eng.Create(ctx, b.vmSpec(rec, cfg), disks, b.r.opts.CacheDir, prepare)
}

func (b *Box) image(rec *store.Box) (*image.Image, error) {
	img, err := b.r.images.Resolve(rec.ImageDigest)
	if err != nil {
		img, err = b.r.images.Resolve(rec.Image)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s of box %s: %w", rec.Image, b.id, err)
	}
	return img, nil
}

// Start boots the box's VM, if it is not running, and waits for its agent.
// Files written in the box before a Stop are still there.
func (b *Box) Start(ctx context.Context) error {
	if dir := b.suspendedDir(); dir != "" {
		return b.resumeFromDisk(ctx, dir)
	}
	if err := b.startWith(ctx, b.r.drv.Start, EventBoxStarted); err != nil {
		return err
	}
	b.idleClockRestart(ctx) // a start is a use
	return nil
}

// startWith is Start with the machine started by start (a boot, or a
// restore from a snapshot); kind is the event a start that works makes
// (box.started, box.resumed from a suspend, box.rolled_back).
func (b *Box) startWith(ctx context.Context, start func(context.Context, vmm.Spec) (vmm.Machine, error), kind EventType) error {
	rec, unlock, err := b.lockLoad(ctx)
	defer unlock()
	if err != nil {
		return err
	}
	return b.startLocked(ctx, rec, start, kind)
}

// startLocked is startWith with the box's lock held, rec its record: the
// engine's start (lifecycle.Box.Start) with what the box is.
func (b *Box) startLocked(ctx context.Context, rec *store.Box, start func(context.Context, vmm.Spec) (vmm.Machine, error), kind EventType) error {
	_, cfg := b.snapshot()
	l := lifecycle.Launch{Spec: b.vmSpec(rec, cfg), Machine: start, IsDeath: func(err error) bool {
		var de *DiedError
		return errors.As(err, &de)
	}}
	if cfg.Pool != "" {
		// A warm pool's box is nobody's yet: not an event (pool.go). It
		// ends with this process until a claim hands it on.
		l.Keep = func(h vmm.Handle) error { return b.r.keeper.Watch(h.PID, h.Start) }
	} else if o := b.r.opts.Observer; o != nil {
		l.Begin = func() func(error) {
			t0 := time.Now()
			return func(err error) {
				d := time.Since(t0)
				o.BoxStarted(BoxStartEvent{BoxID: b.id, Duration: d, Err: err})
				if err != nil {
					b.emit(Event{Type: EventBoxStartFailed, Reason: err.Error(), Duration: d})
				} else {
					b.emit(Event{Type: kind, Duration: d})
				}
			}
		}
	}
	l.Prepare = func(ctx context.Context) (func(context.Context) (vmm.Disks, error), error) {
		img, err := b.image(rec)
		if err != nil {
			return nil, err
		}
		if err := b.r.prepareVolumes(ctx, cfg.Options.Volumes); err != nil {
			return nil, fmt.Errorf("box %s: %w", b.id, err)
		}
		return func(ctx context.Context) (vmm.Disks, error) { return b.r.disks(ctx, img, b.dir) }, nil
	}
	// The host caps; with warm pools, ready pool boxes make room and the
	// start holds its place until its machine runs (pool_caps.go).
	l.Reserve = func(ctx context.Context) (func(), error) {
		return b.r.reserveLaunch(ctx, b.id, cfg.Options.MemoryMiB, cfg.Pool == "")
	}
	l.Net = func() (*helper.Starting, error) { return b.startNet(cfg) }
	l.Running = func(up *store.Box) {
		b.mu.Lock()
		b.rec = up
		b.mu.Unlock()
	}
	l.Ready = func(ctx context.Context) error {
		if err := b.installCA(ctx, cfg); err != nil {
			return fmt.Errorf("box %s: install its CA for secrets: %w", b.id, err)
		}
		b.r.warnBoot()
		return nil
	}
	return b.eng.Start(ctx, rec, l)
}

// hostname is the box's hostname: BoxOptions.Hostname, else its name
// when that is a valid hostname, else its id (guestabi.BoxHostname).
func hostname(rec *store.Box, cfg boxConfig) string {
	return guestabi.BoxHostname(cfg.Options.Hostname, rec.Name, rec.ID)
}

// vmHost is the box as its boot's session (internal/boxvm) sees it.
type vmHost Box

// Boot is the box's record and the machine it names.
func (h *vmHost) Boot() (*store.Box, vmm.Machine) {
	b := (*Box)(h)
	rec, _ := b.snapshot()
	return rec, b.eng.Machine(rec)
}

// Err is the DiedError of death d.
func (h *vmHost) Err(d vmm.Death) error {
	return &DiedError{BoxID: h.id, Cause: d.Cause, ConsoleTail: d.ConsoleTail}
}

// NotRunning is ErrBoxNotRunning (notRunningErr), saying when the box
// was stopped meanwhile.
func (h *vmHost) NotRunning(stopped bool) error {
	if stopped {
		return fmt.Errorf("%w: %s was stopped", ErrBoxNotRunning, h.id)
	}
	return (*Box)(h).notRunningErr()
}

func (h *vmHost) DialErr(ctx context.Context, rec *store.Box, err error) error {
	return (*Box)(h).dialErr(ctx, rec, err)
}

func (h *vmHost) Paused(ctx context.Context, rec *store.Box) (bool, error) {
	return (*Box)(h).pausedState(ctx, rec)
}

// Ending: the keeper lets go of m, and its end is recorded unless the
// runtime is closed (beginLate).
func (h *vmHost) Ending(m vmm.Machine) (func(), bool) {
	if hd := m.Handle(); hd.PID > 0 {
		h.r.keeper.Release(hd.PID, hd.Start) // if it watched it
	}
	if !h.r.beginLate() {
		return nil, false
	}
	return h.r.endLate, true
}

// Died records the death: the box's exit state ("vm-died"), the Observer.
func (h *vmHost) Died(m vmm.Machine, d vmm.Death) {
	rec, _ := (*Box)(h).snapshot()
	recordExit(h.r.opts.Home, h.id, rec.Started, ExitState{Reason: ExitVMDied, Cause: d.Cause})
	if o := h.r.opts.Observer; o != nil {
		o.BoxDied(BoxDiedEvent{BoxID: h.id, Cause: d.Cause})
	}
}

// Spec is the box's machine as rec records it (vmSpec).
func (h *vmHost) Spec(rec *store.Box) vmm.Spec {
	_, cfg := (*Box)(h).snapshot()
	return (*Box)(h).vmSpec(rec, cfg)
}

// StoreErr is the runtime's storeErr for the box.
func (h *vmHost) StoreErr(err error) error { return h.r.storeErr(h.id, err) }

// Forget drops the runtime's handle of the removed box.
func (h *vmHost) Forget() { h.r.forget(h.id) }

// Ended: a box.died event for a death; the record says stopped.
func (h *vmHost) Ended(m vmm.Machine, cause string) {
	if cause != "" {
		(*Box)(h).emit(Event{Type: EventBoxDied, Reason: cause})
	}
	h.r.db.SetStoppedIfPID(context.Background(), h.id, m.Handle().PID)
}

// deadErr returns the DiedError if the VM is known to have died, waiting
// up to wait for the exit watcher to notice.
func (b *Box) deadErr(wait time.Duration) error { return b.vm.DeadErr(wait) }

// client returns a connected agent client, connecting if needed.
func (b *Box) client(ctx context.Context) (*client.Client, error) { return b.vm.Client(ctx) }

// callErr turns a transport error into one that says what happened: the
// VM died (with cause and console), or the connection was lost.
func (b *Box) callErr(err error) error { return b.vm.CallErr(err) }

// GuestInfo describes the guest a box runs.
type GuestInfo struct {
	AgentVersion string        // guest agent version
	Kernel       string        // guest kernel release
	Uptime       time.Duration // time since the guest booted
}

// GuestInfo reports the agent version, guest kernel release and uptime.
func (b *Box) GuestInfo(ctx context.Context) (GuestInfo, error) {
	c, err := b.client(ctx)
	if err != nil {
		return GuestInfo{}, err
	}
	i, err := c.Hello(ctx)
	if err != nil {
		return GuestInfo{}, b.callErr(err)
	}
	return GuestInfo{AgentVersion: i.Version, Kernel: i.Kernel, Uptime: i.Uptime}, nil
}

// StopOptions tune Box.Stop.
type StopOptions struct {
	// Grace is how long the box has to shut down cleanly (its processes
	// told to end, its files flushed) before its machine is told to quit:
	// 0 means DefaultStopGrace; negative means at once.
	Grace time.Duration
}

// DefaultStopGrace is StopOptions.Grace's default: 10 s.
const DefaultStopGrace = defaultStopGrace

// Stop shuts the box down: the agent stops all processes, syncs and
// unmounts the writable layer and powers off; if that does not finish
// within opts' Grace (at most one opts), QEMU is told to quit, then
// killed. Stopping a stopped box is a no-op. An AutoRemove box is removed.
func (b *Box) Stop(ctx context.Context, opts ...StopOptions) error {
	grace := defaultStopGrace
	switch {
	case len(opts) > 1:
		return fmt.Errorf("%w: stop: %d StopOptions, want at most one", ErrInvalidArgument, len(opts))
	case len(opts) == 1 && opts[0].Grace < 0:
		grace = 0
	case len(opts) == 1 && opts[0].Grace > 0:
		grace = opts[0].Grace
	}
	return b.stop(ctx, grace)
}

// StopTimeout is Stop with grace, instead of 10 s, as the time the box has
// to shut down cleanly before its machine is told to quit (0: at once).
//
// Deprecated: use Stop(ctx, StopOptions{Grace: grace}) (a negative Grace
// for at once).
func (b *Box) StopTimeout(ctx context.Context, grace time.Duration) error { return b.stop(ctx, grace) }

// stop is Stop with grace (0: at once).
func (b *Box) stop(ctx context.Context, grace time.Duration) error {
	if dir := b.suspendedDir(); dir != "" {
		// Paused to disk: it goes on from there and shuts down as a
		// running box does, its processes told to end and its files
		// flushed.
		if err := b.resumeFromDisk(ctx, dir); err != nil {
			boxdir.DropSuspended(dir)
			b.r.warn(fmt.Sprintf("box %s: its saved state was discarded: %v", b.id, err))
		}
	}
	b.continueIfPaused(ctx) // shut down cleanly, not after the grace
	unlock, err := b.lock(ctx)
	if err != nil {
		return err
	}
	was, err := b.stopLocked(ctx, grace)
	if err == nil && was {
		b.emit(Event{Type: EventBoxStopped})
	}
	b.r.releasePorts(b.id) // held for an IdleSuspend box (suspend.go)
	unlock()
	if err != nil {
		return err
	}
	if _, cfg := b.snapshot(); cfg.Options.AutoRemove {
		return b.removeWhy(ctx, true, removedAuto)
	}
	return nil
}

// defaultStopGrace is how long Stop waits for a clean shutdown.
const defaultStopGrace = 10 * time.Second

// stopLocked stops the box (b.lock held); was is whether it ran
// (lifecycle.Box.Stop).
func (b *Box) stopLocked(ctx context.Context, grace time.Duration) (was bool, err error) {
	rec, err := b.load(ctx)
	if err != nil {
		return false, err
	}
	return b.eng.Stop(ctx, rec, grace, func() {
		// Recorded before the machine goes: the first reason wins.
		recordExit(b.r.opts.Home, b.id, rec.Started, ExitState{Reason: ExitStopped})
	})
}

// Close releases this handle's connection; the box keeps running. An
// AutoRemove box that this process created is stopped and removed; one
// another process created (a handle from Get or List) is left to it.
func (b *Box) Close() error {
	if _, cfg := b.snapshot(); cfg.Options.AutoRemove && (cfg.OwnerPID == 0 || cfg.OwnerPID == os.Getpid()) {
		return b.removeWhy(context.Background(), true, removedAuto)
	}
	b.vm.DropConn()
	b.r.forget(b.id)
	return nil
}

// Remove deletes the box; see Runtime.Remove.
func (b *Box) Remove(ctx context.Context, force bool) error {
	return b.removeWhy(ctx, force, removedByCaller)
}

// Event.Reason of a box.removed (and the ReapReasons).
const (
	removedByCaller    = "removed"
	removedAuto        = "auto_remove"
	removedStartFailed = "start_failed"
	removedForkFailed  = "fork_failed" // a fork's other children failed
)

// remove removes the box, with no event: a cleanup of a box that had no
// box.created, or whose removal the caller reports.
func (b *Box) remove(ctx context.Context, force bool) error { return b.removeWhy(ctx, force, "") }

// removeWhy removes the box (lifecycle.Box.Remove); a box.removed with
// reason why follows, unless why is "".
func (b *Box) removeWhy(ctx context.Context, force bool, why string) error {
	gone, err := b.eng.Remove(ctx, func(rec *store.Box) error {
		if !force {
			return fmt.Errorf("%w: %s: stop it first, or remove it with force to kill its VM", ErrBoxRunning, b.id)
		}
		b.flushVolumes(ctx, handleOf(rec))
		return nil
	})
	if why != "" && gone {
		// The record is gone: the box is, whatever is left of its
		// directory.
		b.emit(Event{Type: EventBoxRemoved, Reason: why})
	}
	return err
}
