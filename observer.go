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
