package airlock

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Suspend pauses the running box to disk: its memory and device state are
// saved under its box directory and its machine stops, so the box holds
// no host memory and uses no CPU until Resume or Start continue it where
// it was, as the same box (id, name, writable layer, published ports,
// processes with their pids; the clock is stepped to the host's). Open
// network connections do not survive (the network helper starts anew),
// nor do host calls in progress: an Exec still running ends with an error
// while its process runs on in the box (the CLI therefore refuses boxes
// whose main command it follows, as run -d starts them).
// Stop continues a suspended box and shuts it down as it does a running
// one; Remove deletes the saved state with the box. The guest's
// filesystems are flushed first (it runs `sync`, as Commit does). It
// takes about as long as Snapshot.
// A box created with IdleAction IdleSuspend also resumes by itself on
// its next exec, file or port call, and on an inbound connection to a
// published TCP port while this Runtime is open (see IdleSuspend).
// Errors: ErrBoxNotRunning; boxes with volumes are refused (as by
// Snapshot); ErrNotSupported for a driver without snapshots.
func (b *Box) Suspend(ctx context.Context) error {
	sn, err := b.r.snapshotter()
	if err != nil {
		return err
	}
	p, ok := b.r.drv.(vmm.Pauser)
	if !ok {
		return fmt.Errorf("suspend: %w (driver %s)", vmm.ErrNotSupported, b.r.drv.Name())
	}
	if _, cfg := b.snapshot(); len(cfg.Options.Volumes) > 0 {
		return fmt.Errorf("box %s has volumes: boxes with volumes cannot be suspended (QEMU cannot save a mounted share); stop it instead", b.id)
	}
	if err := b.errSuspendPaused(ctx); err != nil {
		return err
	}
	// Flushed, the writable layer holds what the guest wrote even if the
	// saved state is later lost.
	if res, err := b.Exec(ctx, "sync", nil, ExecOptions{Timeout: time.Minute}); err != nil {
		return fmt.Errorf("suspend box %s: flush its filesystems: %w", b.id, err)
	} else if res.ExitCode != 0 {
		b.r.warn(fmt.Sprintf("box %s: sync exited %d before the suspend: %s", b.id, res.ExitCode, strings.TrimSpace(string(res.Stderr))))
	}
	rec, unlock, err := b.lockLoad(ctx)
	defer unlock()
	if err != nil {
		return err
	}
	if !running(rec) {
		return fmt.Errorf("%w: %s", ErrBoxNotRunning, b.id)
	}
	spec, err := b.specWithDisks(ctx, rec)
	if err != nil {
		return err
	}
	bound := readPorts(b.dir) // as its helper bound them, for wakeOnTraffic
	if err := b.eng.Suspend(ctx, rec, spec, sn, p, func() error {
		_, err := b.stopLocked(ctx, 0)
		return err
	}); err != nil {
		return err
	}
	b.emit(Event{Type: EventBoxSuspended})
	b.r.wakeOnTraffic(b, bound)
	return nil
}

// suspendedDir returns where the box's saved state is, "" when the box is
// not suspended (boxdir.SuspendedIn).
func (b *Box) suspendedDir() string { return boxdir.SuspendedIn(b.dir) }

// resumeFromDisk starts the suspended box from its saved state (dir) and
// then drops that state.
func (b *Box) resumeFromDisk(ctx context.Context, dir string) error {
	sn, err := b.r.snapshotter()
	if err != nil {
		return err
	}
	err = b.startWith(ctx, func(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
		return sn.StartFromSnapshot(ctx, spec, dir)
	}, EventBoxResumed)
	if err == nil {
		if err = b.restored(ctx); err != nil {
			// Not resumed: stopped again, the saved state kept.
			if unlock, lerr := b.lock(context.WithoutCancel(ctx)); lerr == nil {
				if was, _ := b.stopLocked(context.WithoutCancel(ctx), 0); was {
					b.emit(Event{Type: EventBoxStopped})
				}
				unlock()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("resume box %s from disk: %w (its saved state stays; 'airlock stop %s' discards it, and the next start boots the box)", b.id, err, b.id)
	}
	boxdir.DropSuspended(dir)
	b.idleClockRestart(ctx) // a resume is a use
	return nil
}

// wake resumes the box first when its idle timeout suspended it
// (IdleSuspend) and it is still suspended: the call that needs it running
// (exec, files, code, ports) then goes on as if it had never stopped.
// Concurrent calls, through any handle of the runtime, resume it once.
// Other boxes, and boxes suspended by an explicit Suspend of a box
// without IdleSuspend, are left as they are (their calls say how to
// resume them).
func (b *Box) wake(ctx context.Context) error {
	if _, cfg := b.snapshot(); cfg.Options.IdleAction != IdleSuspend || b.suspendedDir() == "" {
		return nil
	}
	return b.r.wakeBox(ctx, b)
}

// wakeClient is client after wake, for a call into the box (an exec, a
// file call): a box paused in memory is refused at once (refusePaused).
func (b *Box) wakeClient(ctx context.Context) (*client.Client, error) {
	if err := b.wake(ctx); err != nil {
		return nil, err
	}
	if err := b.refusePaused(ctx); err != nil {
		return nil, err
	}
	return b.client(ctx)
}

// wakeBox resumes the suspended box b, once for concurrent callers
// (lifecycle.Wakes): the first resumes it (bounded by bootTimeout, not by
// its caller's ctx, as the others wait for it too), the others wait for
// that resume's outcome (or their ctx).
func (r *Runtime) wakeBox(ctx context.Context, b *Box) error {
	return r.life.wakes.Do(ctx, b.id, func() error {
		dir := b.suspendedDir()
		if dir == "" {
			return nil // resumed meanwhile
		}
		// The call that wakes the box is a use, from now: a reaper pass
		// that finds the box running while it resumes must not find it
		// idle (its last use from before the suspend) and suspend it again
		// under the call that woke it.
		b.idleClockRestart(ctx)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bootTimeout)
		defer cancel()
		if err := b.resumeFromDisk(rctx, dir); err != nil {
			return fmt.Errorf("box %s was suspended when idle, and resuming it failed: %w", b.id, err)
		}
		return nil
	})
}

// releasePorts closes the ports this runtime holds for box id, if any
// (its stop or removal: they are free again).
func (r *Runtime) releasePorts(id string) { r.life.held.Release(id) }

// releaseStale releases the ports held for boxes that are neither
// running nor suspended, live being the ids of those that are
// (lifecycle.Ports.ReleaseStale); nil live releases every one.
func (r *Runtime) releaseStale(live map[string]bool) {
	r.life.held.ReleaseStale(live, func(id string) string { return filepath.Join(r.opts.Home, "boxes", id) })
}

// wakeOnTraffic keeps the published TCP ports of the IdleSuspend box b,
// just suspended, bound (bound: as its helper had them), and resumes the
// box on the first connection to one, which its new helper then accepts:
// the connection is held while the box resumes, not refused. The ports
// are the ones held since the box's start, else bound now (a box another
// process started: connections that came between its helper's end and
// now were refused). It works while this runtime is open.
func (r *Runtime) wakeOnTraffic(b *Box, bound []PortMapping) {
	if _, cfg := b.snapshot(); cfg.Options.IdleAction != IdleSuspend || len(bound) == 0 {
		return
	}
	err := r.life.held.Watch(b.id, b.dir, publishes(bound), func() {
		if err := b.wake(context.Background()); err != nil {
			// Not resumed: what waits is refused, rather than held for
			// ever.
			r.warn(fmt.Sprintf("box %s: a connection to its published port could not wake it: %v; its ports are closed", b.id, err))
			r.releasePorts(b.id)
		}
	})
	if err != nil {
		r.warn(fmt.Sprintf("box %s: suspended, but its published ports could not be kept bound (%v): connections to them are refused until it is resumed", b.id, err))
	}
}
