// Package execrun is the host side of one exec in a box, apart from the
// box lifecycle: the exec's environment and working directory merged from
// the image, the box and the call; the agent's timeout taken from a
// context deadline; and the wait for its end under the host's own timer,
// the VM's end and cancellation, with the output pipes released so that
// the wait cannot hang on a caller who stopped reading. The root package
// turns what Wait reports into an ExecResult and its error.
package execrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/boundedpipe"
)

// MergeEnv merges KEY=value lists; later lists override earlier keys, and
// the order of first appearance is kept.
func MergeEnv(lists ...[]string) []string {
	idx := map[string]int{}
	var out []string
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := idx[k]; ok {
				out[i] = kv
				continue
			}
			idx[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// First returns the first of s that is not "", else "".
func First(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// MaxOutput is the per-stream cap to ask the agent for when the caller
// asked for max (0: def; negative: none, which is 0 to the agent).
func MaxOutput(max, def int64) int64 {
	switch {
	case max < 0:
		return 0
	case max == 0:
		return def
	}
	return max
}

// DefaultKillGrace is the delay between SIGTERM and SIGKILL of an exec
// that asks for none.
const DefaultKillGrace = 2 * time.Second

// Limits say how long Wait waits for an exec.
type Limits struct {
	// Timeout is the agent's timeout of the exec (0: none); Grace the
	// delay between its SIGTERM and SIGKILL.
	Timeout, Grace time.Duration
	// Slack is how long past Timeout and Grace the host waits for the
	// agent to report the end before it stops trusting the guest.
	Slack time.Duration
	// FromCtx says Timeout is the context's deadline (Deadline): when the
	// context ends for it, the agent's timer fires at the same moment.
	FromCtx bool
}

// Deadline returns l for an exec asked with timeout and grace (0:
// DefaultKillGrace) under ctx: a context deadline sooner than timeout (or
// with no timeout) becomes the agent's timeout (at least 1 ms), so that
// the result can say TimedOut and carry the output produced until then.
func Deadline(ctx context.Context, timeout, grace, slack time.Duration) Limits {
	l := Limits{Timeout: timeout, Grace: grace, Slack: slack}
	if l.Grace == 0 {
		l.Grace = DefaultKillGrace
	}
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); l.Timeout == 0 || d < l.Timeout {
			l.Timeout, l.FromCtx = max(d, time.Millisecond), true
		}
	}
	return l
}

// Host is how long the host waits for the agent to report the end of a
// timed exec: Timeout + Grace + Slack.
func (l Limits) Host() time.Duration { return l.Timeout + l.Grace + l.Slack }

// Proc is the agent's exec as Wait watches it (*client.Proc).
type Proc interface {
	Done() <-chan struct{}
	Kill() error
	Wait() (client.Exit, error)
}

// End is how the wait for an exec ended.
type End struct {
	// Exit and Err are Proc.Wait's.
	Exit client.Exit
	Err  error
	// CtxErr is the context's error when it ended before the exec did
	// (the exec was killed, unless its own timer, FromCtx, ended it).
	CtxErr error
	// VMGone says the VM ended first.
	VMGone bool
	// HostTimedOut says the host's timer (Limits.Host) fired first: the
	// agent did not report the end in time.
	HostTimedOut bool
}

// Wait waits for p to end, or for the host's timer (a timed exec only),
// ctx, or vmExit, whichever comes first. unhealthy is called when the
// agent does not report the end in time (the host timer, or a context
// deadline the agent's timer should have met). Then it calls cancel (the
// call's context), and, when the call ended early (VM gone, ctx, host
// timer), drops what is written to pipes, so that a caller who stopped
// reading cannot keep the receiver blocked; it collects Proc.Wait and
// closes the pipes' write sides.
func Wait(ctx context.Context, p Proc, l Limits, vmExit <-chan struct{}, unhealthy, cancel func(), pipes []*boundedpipe.Pipe) End {
	var e End
	var hostTimer <-chan time.Time
	if l.Timeout > 0 {
		t := time.NewTimer(l.Host())
		defer t.Stop()
		hostTimer = t.C
	}
	select {
	case <-p.Done():
	case <-hostTimer:
		e.HostTimedOut = true
		unhealthy()
		// In its own goroutine: a guest that stopped reading can leave the
		// stream's send window full, and cancel (below) closes it.
		go p.Kill()
	case <-ctx.Done():
		if l.FromCtx && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The agent's timer fires at the same moment.
			select {
			case <-p.Done():
			case <-time.After(l.Grace + l.Slack):
				unhealthy()
				e.CtxErr = ctx.Err()
			}
		} else {
			e.CtxErr = ctx.Err()
			go p.Kill() // see the host timer above
			select {
			case <-p.Done():
			case <-time.After(5 * time.Second):
			}
		}
	case <-vmExit:
		e.VMGone = true
	}
	cancel()
	if e.VMGone || e.CtxErr != nil || e.HostTimedOut {
		// The call is over: a caller who stopped reading must not keep
		// the receiver blocked on a full pipe (Wait would hang).
		for _, bp := range pipes {
			bp.DropWrites()
		}
	}
	e.Exit, e.Err = p.Wait()
	for _, bp := range pipes {
		bp.CloseWrite()
	}
	return e
}

// Outcome is the error of the exec that ended as e (nil: its result
// stands): none when the host's timer ended it (a timeout on the host's
// authority) or it ended on its own, unless ctx ended it first (ctx's
// error; a timeout of the agent's, FromCtx, stands); when ctx ended a
// call that then failed, dead's error (the VM died), else ctx's; any
// other failure of the call, lost(e.Err).
func (e End) Outcome(dead func() error, lost func(error) error) error {
	switch {
	case e.HostTimedOut && e.Err != nil:
		return nil
	case e.Err == nil:
		if e.CtxErr != nil && !e.Exit.TimedOut {
			return e.CtxErr
		}
		return nil
	case e.CtxErr != nil:
		if de := dead(); de != nil {
			return de
		}
		return e.CtxErr
	}
	return lost(e.Err)
}

// CheckSize refuses a terminal size outside 1..65535 cells each way.
func CheckSize(rows, cols int) error {
	if rows <= 0 || cols <= 0 || rows > 0xffff || cols > 0xffff {
		return fmt.Errorf("terminal size %dx%d: want 1..65535 each", rows, cols)
	}
	return nil
}

// Stdin is the input side of an agent exec (*client.Proc).
type Stdin interface {
	WriteStdin([]byte) error
	CloseStdin() error
}

// CopyStdin copies r to the exec's standard input, closing it at r's end
// or error; it stops when a write fails (the exec ended).
func CopyStdin(p Stdin, r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if p.WriteStdin(buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			p.CloseStdin()
			return
		}
	}
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

// Counting returns w counting the bytes written through it in n (nil
// stays nil).
func Counting(w io.Writer, n *atomic.Int64) io.Writer {
	if w == nil {
		return nil
	}
	return countingWriter{w, n}
}
