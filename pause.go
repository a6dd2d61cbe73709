package airlock

import (
	"context"
	"fmt"
	"time"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// pausedNow reports whether the VM of rec is paused (Pause): its vCPUs
// are stopped, so its agent answers no new connection's handshake. False
// when the driver cannot tell (lifecycle.Box.Paused).
func (b *Box) pausedNow(ctx context.Context, rec *store.Box) bool { return b.eng.Paused(ctx, rec) }

// pausedState asks the driver whether the machine of rec is paused; an
// error says it could not tell (no machine, no answer, a driver that
// cannot pause; lifecycle.Box.PausedState).
func (b *Box) pausedState(ctx context.Context, rec *store.Box) (bool, error) {
	return b.eng.PausedState(ctx, rec)
}

// snapshotAgentVersion is the guest agent version a snapshot of the box
// records. A paused box's agent cannot complete a new connection's
// handshake (a snapshot from another process than the one that paused it
// waited 30 s and failed): for such a box it is the version of the agent
// this airlock speaks, the only one a connection accepts (a box still
// running an older agent is refused at its restore, saying so).
func (b *Box) snapshotAgentVersion(ctx context.Context, rec *store.Box) (string, error) {
	c := b.vm.Conn()
	if c == nil && b.pausedNow(ctx, rec) {
		return agentpb.Version, nil
	}
	c, err := b.client(ctx)
	if err != nil {
		return "", err
	}
	return c.AgentVersion(), nil
}

// dialErr is the error of a failed connection to the box's agent: a
// paused box is named as paused, with what to do.
func (b *Box) dialErr(ctx context.Context, rec *store.Box, err error) error {
	if ctx.Err() == nil && b.pausedNow(context.WithoutCancel(ctx), rec) {
		return fmt.Errorf("%w (%w)", b.pausedErr(), err)
	}
	return fmt.Errorf("connect to agent of box %s: %w", b.id, err)
}

// pausedCheckTimeout bounds refusePaused's question to the driver: a
// paused or running QEMU answers QMP at once; one that does not (frozen,
// or its QMP socket held by a snapshot) is taken for not paused, and the
// call goes on to its agent as before.
const pausedCheckTimeout = 1500 * time.Millisecond

// refusePaused is ErrBoxPaused (pausedErr) when the box is paused in
// memory, else nil. A call into the box asks before it uses the agent: a
// paused guest answers no new connection's handshake (a fresh process's
// exec waited the whole handshake timeout, about 31 s, before it failed)
// nor a call on an old connection (it waited as long as its context).
// Only calls a user makes ask (wakeClient: exec, files, code runs); the
// restore, resume and rollback paths connect to a machine that is still
// paused on purpose and continue it.
func (b *Box) refusePaused(ctx context.Context) error {
	rec, _ := b.snapshot()
	if rec == nil || !running(rec) {
		return nil // the call's own error says the box is not running
	}
	qctx, cancel := context.WithTimeout(ctx, pausedCheckTimeout)
	defer cancel()
	if paused, err := b.pausedState(qctx, rec); err == nil && paused {
		return b.pausedErr()
	}
	return nil
}

// pausedErr is ErrBoxPaused for this box, naming the one thing to do.
func (b *Box) pausedErr() error {
	return fmt.Errorf("%w: %s: its processes are stopped until it is unpaused (airlock unpause %s, or Box.Resume)", ErrBoxPaused, b.id, b.id)
}

// continueIfPaused lets a box paused in memory run again (QMP cont) so
// that a stop shuts it down cleanly: a paused guest cannot answer the
// shutdown request, and Stop waited out its whole grace (10 s) and then
// made the machine quit, its processes never told and its files not
// flushed.
func (b *Box) continueIfPaused(ctx context.Context) {
	if rec, err := b.load(ctx); err == nil {
		b.eng.Continue(ctx, rec)
	}
}

// errSuspendPaused refuses a pause to disk of a box paused in memory at
// once: its guest must flush its files first (Suspend runs sync), which it
// cannot while its vCPUs are stopped (the sync waited 30 s and failed).
func (b *Box) errSuspendPaused(ctx context.Context) error {
	rec, err := b.load(ctx)
	if err != nil || !b.pausedNow(ctx, rec) {
		return nil
	}
	return fmt.Errorf("box %s is paused in memory: unpause it first (airlock unpause %s), then pause it to disk: its guest flushes its files before its memory is saved", b.id, b.id)
}

// notRunningErr is ErrBoxNotRunning for a call into the box, saying so
// when the box is paused to disk (Suspend) and how to go on.
func (b *Box) notRunningErr() error {
	if b.suspendedDir() != "" {
		return fmt.Errorf("%w: %s is paused to disk: unpause it first (airlock unpause %s, or Box.Resume)", ErrBoxNotRunning, b.id, b.id)
	}
	return fmt.Errorf("%w: %s", ErrBoxNotRunning, b.id)
}

func (b *Box) pauser() (vmm.Pauser, vmm.Spec, vmm.Handle, error) {
	p, ok := b.r.drv.(vmm.Pauser)
	if !ok {
		return nil, vmm.Spec{}, vmm.Handle{}, fmt.Errorf("pause: %w (driver %s)", vmm.ErrNotSupported, b.r.drv.Name())
	}
	rec, err := b.load(context.Background())
	if err != nil {
		return nil, vmm.Spec{}, vmm.Handle{}, err
	}
	if !running(rec) {
		return nil, vmm.Spec{}, vmm.Handle{}, fmt.Errorf("%w: %s", ErrBoxNotRunning, b.id)
	}
	_, cfg := b.snapshot()
	return p, b.vmSpec(rec, cfg), handleOf(rec), nil
}

// Pause stops the box's vCPUs: its processes make no progress and use no
// host CPU (its memory stays allocated) until Resume. Calls into a paused
// box are refused with ErrBoxPaused (Exec, the file calls, code runs)
// until Resume. Errors: ErrBoxNotRunning.
func (b *Box) Pause(ctx context.Context) error {
	p, spec, h, err := b.pauser()
	if err != nil {
		return err
	}
	was, _ := p.Paused(ctx, spec, h)
	if err := p.Pause(ctx, spec, h); err != nil {
		return fmt.Errorf("pause box %s: %w", b.id, err)
	}
	if !was {
		b.emit(Event{Type: EventBoxPaused})
	}
	return nil
}

// Resume lets a paused box run on, or a suspended one (Suspend) continue
// from its saved state; resuming a running box is a no-op. The guest's
// clock stood still while it was paused: Resume steps it to the host's
// time.
func (b *Box) Resume(ctx context.Context) error {
	if rec, err := b.load(ctx); err == nil && !running(rec) {
		if dir := b.suspendedDir(); dir != "" {
			return b.resumeFromDisk(ctx, dir)
		}
	}
	p, spec, h, err := b.pauser()
	if err != nil {
		return err
	}
	was, _ := p.Paused(ctx, spec, h)
	if err := p.Resume(ctx, spec, h); err != nil {
		return fmt.Errorf("resume box %s: %w", b.id, err)
	}
	if was {
		b.emit(Event{Type: EventBoxResumed})
	}
	c, err := b.client(ctx)
	if err != nil {
		return err
	}
	if _, err := c.Restored(ctx, nil, time.Now().UnixNano(), ""); err != nil {
		return fmt.Errorf("resume box %s: step its clock: %w", b.id, b.callErr(err))
	}
	return nil
}

// Paused reports whether the box is paused (Pause).
func (b *Box) Paused(ctx context.Context) (bool, error) {
	p, spec, h, err := b.pauser()
	if err != nil {
		return false, err
	}
	return p.Paused(ctx, spec, h)
}
