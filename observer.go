package airlock

import (
	"io"
	"sync/atomic"
	"time"
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

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// counting wraps w in a countingWriter (nil stays nil).
func counting(w io.Writer, n *atomic.Int64) io.Writer {
	if w == nil {
		return nil
	}
	return countingWriter{w, n}
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
