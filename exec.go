package airlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/boundedpipe"
	"github.com/airlock-run/airlock/internal/headtail"
)

// mergeEnv merges KEY=value lists; later lists override earlier keys, and
// the order of first appearance is kept.
func mergeEnv(lists ...[]string) []string {
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

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func (b *Box) spec(cmd string, args []string, opts ExecOptions, stdin bool) client.Spec {
	b.mu.Lock()
	cfg := b.cfg
	b.mu.Unlock()
	return client.Spec{
		Argv:       append([]string{cmd}, args...),
		Env:        mergeEnv(cfg.Image.Env, secretEnv(cfg), cfg.Options.Env, opts.Env),
		WorkingDir: firstNonEmpty(opts.WorkingDir, cfg.Options.WorkingDir, cfg.Image.WorkingDir, "/"),
		User:       firstNonEmpty(opts.User, cfg.Options.User, cfg.Image.User),
		Stdin:      stdin,
		Timeout:    opts.Timeout,
		KillGrace:  opts.KillGrace,
		TTY:        opts.TTY,
		Rows:       opts.Rows,
		Cols:       opts.Cols,
	}
}

// maxOutput is the per-stream cap Exec asks for: 0 for none.
func (o ExecOptions) maxOutput() int64 {
	switch {
	case o.MaxOutput < 0:
		return 0
	case o.MaxOutput == 0:
		return DefaultMaxOutput
	}
	return o.MaxOutput
}

// DefaultCommand returns the image's default argv (Entrypoint + Cmd, as
// Docker combines them); empty when the image defines neither.
func (b *Box) DefaultCommand() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append(append([]string(nil), b.cfg.Image.Entrypoint...), b.cfg.Image.Cmd...)
}

// ImageCommand returns the image's Entrypoint and Cmd apart (either may be
// empty), for callers that combine them with their own command the way
// Kubernetes does (a pod's command replaces Entrypoint and drops Cmd; its
// args alone replace Cmd).
func (b *Box) ImageCommand() (entrypoint, cmd []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.cfg.Image.Entrypoint...), append([]string(nil), b.cfg.Image.Cmd...)
}

// Exec runs cmd with args in the box and waits for it to finish. cmd is
// looked up in the box's PATH like a shell would. A non-zero exit status is
// reported in ExecResult, not as an error; so is a timeout (TimedOut). The
// error is non-nil only when the exec could not be carried out: the box is
// not running (ErrBoxNotRunning), its VM died (ErrBoxDied, with the cause
// and the console's tail), or ctx was cancelled (ctx.Err(), after the
// process tree was killed). An empty cmd is ErrInvalidArgument, before
// anything is sent to the box. Output is returned byte for byte up to
// opts.MaxOutput (16 MiB) per stream; past that its head and tail are kept,
// the middle is dropped inside the box and ExecResult.Truncated is set.
func (b *Box) Exec(ctx context.Context, cmd string, args []string, opts ExecOptions) (*ExecResult, error) {
	p, err := b.ExecStart(ctx, cmd, args, opts)
	if err != nil {
		return nil, err
	}
	return p.Wait()
}

// ExecStart is Exec without the wait: it starts cmd and returns at once,
// so that the process can be signalled or killed (Process.Kill) while it
// runs. Process.Wait then returns what Exec would: the output kept as Exec
// keeps it (opts.MaxOutput per stream; past it the head and the tail,
// Truncated and the Dropped counts set). Process.Stdout and Stderr read
// nothing; the process reads opts.Stdin, or /dev/null when it is nil. The
// errors are Exec's.
func (b *Box) ExecStart(ctx context.Context, cmd string, args []string, opts ExecOptions) (*Process, error) {
	max := opts.maxOutput()
	// The agent drops the middle; the host caps again what arrives, so a
	// misbehaving guest cannot grow host memory past 2*max either.
	out, errb := headtail.NewBuffer(max), headtail.NewBuffer(max)
	p, err := b.startMax(ctx, cmd, args, opts, out, errb, opts.Stdin != nil, max)
	if err != nil {
		return nil, err
	}
	if opts.Stdin != nil {
		go p.copyStdin(opts.Stdin)
	}
	return p, nil
}

// ExecStream starts cmd and returns at once. Read its output from
// Process.Stdout and Process.Stderr while it runs, or set opts.Stdout and
// opts.Stderr to have it written to writers; each stream is buffered up to
// 1 MiB, past that the guest process is paused until the caller reads, so a
// command printing gigabytes does not grow host memory. Write to
// Process.Stdin (when opts.Stdin is nil). Call Wait for the result; see
// Exec for errors.
func (b *Box) ExecStream(ctx context.Context, cmd string, args []string, opts ExecOptions) (*Process, error) {
	if opts.Stdout != nil || opts.Stderr != nil {
		return b.execStreamTo(ctx, cmd, args, opts, orDiscard(opts.Stdout), orDiscard(opts.Stderr), true)
	}
	outR, outW := boundedpipe.New(1 << 20)
	errR, errW := boundedpipe.New(1 << 20)
	p, err := b.start(ctx, cmd, args, opts, outW, errW, true)
	if err != nil {
		return nil, err
	}
	p.stdout, p.stderr = outR, errR
	if opts.Stdin != nil {
		go p.copyStdin(opts.Stdin)
	}
	return p, nil
}

// ExecStreamWriters is ExecStream with output written to stdout and stderr
// as it arrives (a slow writer slows the guest process down). The process's
// stdin is opts.Stdin, or /dev/null when that is nil.
//
// Deprecated: use ExecStream with ExecOptions.Stdout and Stderr (and
// ExecOptions.Stdin for the input).
func (b *Box) ExecStreamWriters(ctx context.Context, cmd string, args []string, opts ExecOptions, stdout, stderr io.Writer) (*Process, error) {
	return b.execStreamTo(ctx, cmd, args, opts, stdout, stderr, false)
}

// execStreamTo starts cmd with its output written to stdout and stderr;
// its stdin is opts.Stdin, else Process.Stdin when pipe is set, else
// /dev/null.
func (b *Box) execStreamTo(ctx context.Context, cmd string, args []string, opts ExecOptions, stdout, stderr io.Writer, pipe bool) (*Process, error) {
	p, err := b.start(ctx, cmd, args, opts, stdout, stderr, opts.Stdin != nil || pipe)
	if err != nil {
		return nil, err
	}
	if opts.Stdin != nil {
		go p.copyStdin(opts.Stdin)
	}
	return p, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// Process is a running exec started by ExecStream.
type Process struct {
	b      *Box
	proc   *client.Proc
	t0     time.Time
	stdout io.Reader
	stderr io.Reader
	pipes  []*boundedpipe.Pipe
	cancel context.CancelFunc
	done   chan struct{}
	res    *ExecResult
	err    error
	ctxErr error

	// outBytes counts output for the Observer.
	outBytes atomic.Int64
}

func (b *Box) start(ctx context.Context, cmd string, args []string, opts ExecOptions, stdout, stderr io.Writer, stdin bool) (*Process, error) {
	return b.startMax(ctx, cmd, args, opts, stdout, stderr, stdin, 0)
}

// startMax is start with the agent keeping at most maxOutput bytes of each
// stream (0: all).
func (b *Box) startMax(ctx context.Context, cmd string, args []string, opts ExecOptions, stdout, stderr io.Writer, stdin bool, maxOutput int64) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(cmd) == "" {
		return nil, fmt.Errorf("%w: box %s: empty command (give the program to run)", ErrInvalidArgument, b.id)
	}
	c, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	spec := b.spec(cmd, args, opts, stdin)
	spec.MaxOutput = maxOutput
	// A context deadline becomes the agent's timeout, so the result can
	// say TimedOut and carry the output produced until then.
	fromDeadline := false
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); spec.Timeout == 0 || d < spec.Timeout {
			spec.Timeout = max(d, time.Millisecond)
			fromDeadline = true
		}
	}
	grace := spec.KillGrace
	if grace == 0 {
		grace = 2 * time.Second
	}
	// The call itself must outlive ctx long enough to hear the result.
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &Process{b: b, t0: time.Now(), cancel: cancel, done: make(chan struct{})}
	// ExecStart's buffers: the result carries what they kept.
	keptOut, _ := stdout.(*headtail.Buffer)
	keptErr, _ := stderr.(*headtail.Buffer)
	for _, w := range []io.Writer{stdout, stderr} {
		if bp, ok := w.(*boundedpipe.Pipe); ok {
			p.pipes = append(p.pipes, bp)
		}
	}
	if b.r.opts.Observer != nil {
		stdout, stderr = counting(stdout, &p.outBytes), counting(stderr, &p.outBytes)
	}
	used := b.useBegin(ctx)
	proc, err := c.Exec(callCtx, spec, stdout, stderr)
	if err != nil {
		used()
		cancel()
		return nil, b.callErr(err)
	}
	p.proc = proc
	b.mu.Lock()
	vmExit := b.vmExit
	b.mu.Unlock()
	// The host's own timer: a guest that does not report the end of a
	// timed-out exec is not waited for beyond it.
	var hostTimer <-chan time.Time
	var stopTimer func() bool
	hostLimit := spec.Timeout + grace + hostSlack
	if spec.Timeout > 0 {
		t := time.NewTimer(hostLimit)
		hostTimer, stopTimer = t.C, t.Stop
	}
	go func() {
		defer close(p.done)
		if opts.Main {
			// Recorded before Wait returns.
			defer func() {
				if p.err == nil && p.res != nil {
					b.recordMainExit(context.WithoutCancel(ctx), p.res)
				}
			}()
		}
		defer used()
		defer b.r.execEnded(p)
		if keptOut != nil && keptErr != nil {
			defer func() {
				if res := p.res; res != nil {
					res.Stdout, res.Stderr = keptOut.Bytes(), keptErr.Bytes()
					res.StdoutDropped += keptOut.Dropped()
					res.StderrDropped += keptErr.Dropped()
					res.Truncated = res.StdoutDropped > 0 || res.StderrDropped > 0
				}
			}()
		}
		defer cancel()
		if stopTimer != nil {
			defer stopTimer()
		}
		gone, hostTimedOut := false, false
		unhealthy := func() {
			b.markUnhealthy(fmt.Sprintf("the agent did not report the end of %q within %s of its %s timeout", cmd, hostLimit-spec.Timeout, spec.Timeout))
		}
		select {
		case <-proc.Done():
		case <-hostTimer:
			hostTimedOut = true
			unhealthy()
			// In its own goroutine: a guest that stopped reading can leave the
			// stream's send window full, and cancel (below) closes it.
			go proc.Kill()
		case <-ctx.Done():
			if fromDeadline && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The agent's timer fires at the same moment.
				select {
				case <-proc.Done():
				case <-time.After(grace + hostSlack):
					unhealthy()
					p.ctxErr = ctx.Err()
				}
			} else {
				p.ctxErr = ctx.Err()
				go proc.Kill() // see the host timer above
				select {
				case <-proc.Done():
				case <-time.After(5 * time.Second):
				}
			}
		case <-vmExit:
			gone = true
		}
		cancel()
		if gone || p.ctxErr != nil || hostTimedOut {
			// The call is over: a caller who stopped reading must not keep
			// the receiver blocked on a full pipe (Wait would hang).
			for _, bp := range p.pipes {
				bp.DropWrites()
			}
		}
		ex, err := proc.Wait()
		for _, bp := range p.pipes {
			bp.CloseWrite()
		}
		res := &ExecResult{
			ExitCode: ex.Code, Signal: int(ex.Signal), TimedOut: ex.TimedOut, ErrorMessage: ex.Error,
			Duration: time.Since(p.t0), GuestDuration: time.Duration(ex.GuestNs),
			StdoutDropped: ex.StdoutDropped, StderrDropped: ex.StderrDropped, OOMKilled: ex.OOMKilled,
		}
		switch {
		case hostTimedOut && err != nil:
			// What arrived is kept; the guest's word on the exit is not.
			res.TimedOut, res.ExitCode = true, -1
			res.ErrorMessage = fmt.Sprintf("timed out after %s; the box did not confirm the process ended within %s more and is marked unhealthy (Box.Unhealthy)", spec.Timeout, hostLimit-spec.Timeout)
			p.res = res
		case err == nil:
			if p.ctxErr != nil && !ex.TimedOut {
				p.res, p.err = res, p.ctxErr
				return
			}
			p.res = res
		case p.ctxErr != nil:
			if de := b.deadErr(0); de != nil {
				p.res, p.err = res, de
				return
			}
			p.res, p.err = res, p.ctxErr
		default:
			p.res, p.err = res, b.callErr(err)
		}
	}()
	return p, nil
}

// callErr turns a transport error into one that says what happened: the VM
// died (with cause and console), or the connection was lost.
func (b *Box) callErr(err error) error {
	if de := b.deadErr(1500 * time.Millisecond); de != nil {
		return de
	}
	var cut error
	b.mu.Lock()
	if b.conn != nil {
		select {
		case <-b.conn.Done():
			cut = b.conn.Err()
			b.conn = nil
		default:
		}
	}
	b.mu.Unlock()
	if errors.Is(cut, client.ErrHostileAgent) {
		return fmt.Errorf("box %s: %w", b.id, cut)
	}
	return fmt.Errorf("box %s: lost the connection to its agent (%v); the box may be overloaded or stopping — its console log %s may say why", b.id, err, b.ConsoleLog())
}

func (p *Process) copyStdin(r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if p.proc.WriteStdin(buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			p.proc.CloseStdin()
			return
		}
	}
}

// Stdout returns the process's standard output (ExecStream only).
func (p *Process) Stdout() io.Reader {
	if p.stdout == nil {
		return strings.NewReader("")
	}
	return p.stdout
}

// Stderr returns the process's standard error (ExecStream only).
func (p *Process) Stderr() io.Reader {
	if p.stderr == nil {
		return strings.NewReader("")
	}
	return p.stderr
}

// Stdin returns a writer to the process's standard input. Close it to send
// EOF. Not available when ExecOptions.Stdin was set.
func (p *Process) Stdin() io.WriteCloser { return stdinWriter{p} }

type stdinWriter struct{ p *Process }

func (w stdinWriter) Write(b []byte) (int, error) {
	if err := w.p.proc.WriteStdin(b); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (w stdinWriter) Close() error { return w.p.proc.CloseStdin() }

// Signal sends sig to the process (not its children).
func (p *Process) Signal(sig syscall.Signal) error { return p.proc.Signal(sig) }

// Resize sets the size of the process's terminal (ExecOptions.TTY) to rows
// x cols character cells; the process gets SIGWINCH.
func (p *Process) Resize(rows, cols int) error {
	if rows <= 0 || cols <= 0 || rows > 0xffff || cols > 0xffff {
		return fmt.Errorf("terminal size %dx%d: want 1..65535 each", rows, cols)
	}
	return p.proc.Resize(rows, cols)
}

// Kill kills the process and everything it started.
func (p *Process) Kill() error { return p.proc.Kill() }

// Done is closed when the process has ended and all output was delivered.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the process to end and all its output to be delivered,
// and returns the result. See Exec for the errors.
func (p *Process) Wait() (*ExecResult, error) {
	<-p.done
	return p.res, p.err
}
