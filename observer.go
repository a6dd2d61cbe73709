package airlock

import (
	"time"

	"github.com/airlock-run/airlock/internal/vmm"
)

// Observer receives the runtime's events, for metrics (airlock serve feeds
// Prometheus from them; the library itself imports no metrics package).
// Methods are called synchronously from the goroutine where the event
// happens, sometimes with internal locks held: they must return quickly
// and must not call back into the Runtime or its Boxes.
type Observer interface {
	// BoxStarted reports a boot (Start of a box that was not running).
	BoxStarted(BoxStartEvent)
	// ExecEnded reports an exec (Exec, ExecStart, ExecStream)
	// that ended.
	ExecEnded(ExecEvent)
	// BoxDied reports a VM that ended unexpectedly (not by Stop or
	// Remove).
	BoxDied(BoxDiedEvent)
	// ImagePulled reports a pull of an image missing from the store.
	ImagePulled(ImagePullEvent)
}

// BoxStartEvent describes one boot.
type BoxStartEvent struct {
	BoxID string
	// Duration is from Start to an answering agent (or to the failure).
	Duration time.Duration
	// Err is the error Start returned, nil on success.
	Err error
}

// ExecEvent describes one exec that ended.
type ExecEvent struct {
	BoxID    string
	Duration time.Duration
	ExitCode int
	TimedOut bool
	// OutputBytes counts stdout and stderr bytes received from the guest.
	OutputBytes int64
	// Err is the error Wait returned (the exec could not be carried out).
	Err error
}

// BoxDiedEvent describes a VM that ended unexpectedly.
type BoxDiedEvent struct {
	BoxID string
	// Cause is DiedError.Cause.
	Cause string
}

// ImagePullEvent describes a pull.
type ImagePullEvent struct {
	Ref      string
	Duration time.Duration
	Err      error
}

// execEnded reports p's end to the observer, if any.
func (r *Runtime) execEnded(p *Process) {
	o := r.opts.Observer
	if o == nil {
		return
	}
	if _, cfg := p.b.snapshot(); cfg.Pool != "" {
		return // a warm pool's box: nobody's exec (pool.go)
	}
	e := ExecEvent{BoxID: p.b.id, Duration: time.Since(p.t0), OutputBytes: p.outBytes.Load(), Err: p.err}
	if p.res != nil {
		e.ExitCode, e.TimedOut = p.res.ExitCode, p.res.TimedOut
	}
	o.ExecEnded(e)
	p.b.emit(Event{Type: EventExecEnded, ExecID: p.id, ExitCode: e.ExitCode, TimedOut: e.TimedOut, Err: e.Err, Duration: e.Duration})
}

// warn sends msg to Options.Warn, once per Runtime ("" is not sent).
func (r *Runtime) warn(msg string) {
	r.mu.Lock()
	seen := r.warned[msg]
	r.warned[msg] = true
	r.mu.Unlock()
	if !seen && msg != "" {
		r.opts.Warn(msg)
	}
}

// warnBoot passes on, once per Runtime, what the driver says the user
// should hear once a box has booted (a box just started under TCG that
// AIRLOCK_ACCEL did not ask for; the kernel fallback). A failed start
// warns of nothing.
func (r *Runtime) warnBoot() {
	for _, w := range vmm.BootWarnings(r.drv) {
		r.warn(w)
	}
}

// EventType names a Event: what happened to a box.
type EventType string

// Event types, in the order a box's life usually brings them. A box of a
// warm pool (Options.Pool) has none until a Create claims it; the claim
// is its box.created and box.started.
const (
	// EventBoxCreated: the box is recorded and its disk prepared (Create,
	// a restore, a fork's child). Always the box's first event.
	EventBoxCreated EventType = "box.created"
	// EventBoxStarted: its VM booted and its agent answers (Start, Create).
	EventBoxStarted EventType = "box.started"
	// EventBoxStartFailed: a start failed; Reason says why.
	EventBoxStartFailed EventType = "box.start_failed"
	// EventBoxPaused: its vCPUs were stopped (Pause).
	EventBoxPaused EventType = "box.paused"
	// EventBoxResumed: a paused box runs on, or a suspended one continues
	// from its saved state (Resume; Start or Stop of a suspended box).
	EventBoxResumed EventType = "box.resumed"
	// EventBoxSuspended: the box was paused to disk; its VM is gone
	// (Suspend).
	EventBoxSuspended EventType = "box.suspended"
	// EventBoxSnapshotted: a snapshot of the box was taken; Snapshot
	// names it.
	EventBoxSnapshotted EventType = "box.snapshotted"
	// EventBoxCheckpointed: a checkpoint of the box was taken; Snapshot
	// names it (Checkpoint).
	EventBoxCheckpointed EventType = "box.checkpointed"
	// EventBoxRolledBack: the box's machine started again from one of its
	// checkpoints (Rollback), after the box.stopped of its old machine
	// when it ran.
	EventBoxRolledBack EventType = "box.rolled_back"
	// EventBoxForked: the box was forked; Children are the new boxes
	// (each has had its box.created and box.started before).
	EventBoxForked EventType = "box.forked"
	// EventBoxStopped: a running box was stopped (Stop; not a Stop of a
	// stopped box, which does nothing).
	EventBoxStopped EventType = "box.stopped"
	// EventBoxRemoved: the box is gone; Reason is why: "removed" (Remove),
	// "auto_remove" (an AutoRemove box stopped or closed), "start_failed"
	// (Create's boot failed), or a ReapReason.
	EventBoxRemoved EventType = "box.removed"
	// EventBoxDied: its VM ended unexpectedly; Reason is DiedError.Cause.
	EventBoxDied EventType = "box.died"
	// EventExecStarted: a process started in the box (every exec,
	// buffered or streamed, and those code runs and a context's kernel make:
	// a context's cells run in its kernel, one exec); Cmd is its argv.
	EventExecStarted EventType = "exec.started"
	// EventExecEnded: that process ended (or could not be waited for);
	// ExitCode, TimedOut, Err, Duration.
	EventExecEnded EventType = "exec.ended"
)

// Event is one transition of a box, as an EventObserver hears it.
type Event struct {
	Type  EventType
	BoxID string
	// Time is when it happened.
	Time time.Time
	// Reason: why a box was removed, why its VM died, why a start failed.
	Reason string
	// Snapshot: box.snapshotted's snapshot name.
	Snapshot string
	// Children: box.forked's new boxes, by id.
	Children []string
	// ExecID numbers the execs of this Runtime (from 1): an exec.started
	// and its exec.ended carry the same.
	ExecID uint64
	// Cmd: exec.started's argv.
	Cmd []string
	// ExitCode, TimedOut, Err: exec.ended's result (Err: the exec could
	// not be carried out; ExitCode is then 0).
	ExitCode int
	TimedOut bool
	Err      error
	// Duration: exec.ended's run time; box.started's and
	// box.start_failed's boot time.
	Duration time.Duration
}

// EventObserver is an Observer that also hears every Event: each
// transition once, from the goroutine that makes it, after it happened
// and before the call that made it returns (so a box's events come in
// the order of its transitions; events of different boxes interleave).
// The Runtime checks Options.Observer for it; the same rules as
// Observer's apply (return quickly, do not call back into the Runtime).
type EventObserver interface {
	Observer
	BoxEvent(Event)
}

// emit sends ev about b to an EventObserver, if any; not for a warm
// pool's box (nobody's yet).
func (b *Box) emit(ev Event) {
	o, ok := b.r.opts.Observer.(EventObserver)
	if !ok {
		return
	}
	if _, cfg := b.snapshot(); cfg.Pool != "" {
		return
	}
	ev.BoxID = b.id
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	o.BoxEvent(ev)
}

// execStarted reports p's start to an EventObserver.
func (r *Runtime) execStarted(p *Process, cmd string, args []string) {
	if _, ok := r.opts.Observer.(EventObserver); !ok {
		return
	}
	p.b.emit(Event{Type: EventExecStarted, ExecID: p.id, Cmd: append([]string{cmd}, args...)})
}
