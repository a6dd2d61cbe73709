package airlock

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/boundedpipe"
	"github.com/airlock-run/airlock/internal/checkpoint"
	"github.com/airlock-run/airlock/internal/execrun"
	"github.com/airlock-run/airlock/internal/headtail"
	"github.com/airlock-run/airlock/internal/secrets"
)

func (b *Box) spec(cmd string, args []string, opts ExecOptions, stdin bool) client.Spec {
	b.mu.Lock()
	cfg := b.cfg
	b.mu.Unlock()
	return client.Spec{
		Argv:       append([]string{cmd}, args...),
		Env:        execrun.MergeEnv(cfg.Image.Env, secrets.Env(cfg.Placeholders), cfg.Options.Env, opts.Env),
		WorkingDir: execrun.First(opts.WorkingDir, cfg.Options.WorkingDir, cfg.Image.WorkingDir, "/"),
		User:       execrun.First(opts.User, cfg.Options.User, cfg.Image.User),
		Stdin:      stdin,
		Timeout:    opts.Timeout,
		KillGrace:  opts.KillGrace,
		TTY:        opts.TTY,
		Rows:       opts.Rows,
		Cols:       opts.Cols,
	}
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
	max := execrun.MaxOutput(opts.MaxOutput, DefaultMaxOutput)
	// The agent drops the middle; the host caps again what arrives, so a
	// misbehaving guest cannot grow host memory past 2*max either.
	out, errb := headtail.NewBuffer(max), headtail.NewBuffer(max)
	return b.startMax(ctx, cmd, args, opts, out, errb, opts.Stdin != nil, max)
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
	return b.start(ctx, cmd, args, opts, stdout, stderr, opts.Stdin != nil || pipe)
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
	// id is Event.ExecID.
	id uint64
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
	c, err := b.wakeClient(ctx)
	if err != nil {
		return nil, err
	}
	spec := b.spec(cmd, args, opts, stdin)
	spec.MaxOutput = maxOutput
	// A context deadline becomes the agent's timeout (execrun.Deadline).
	lim := execrun.Deadline(ctx, spec.Timeout, spec.KillGrace, hostSlack)
	spec.Timeout = lim.Timeout
	// The call itself must outlive ctx long enough to hear the result.
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &Process{b: b, t0: time.Now(), cancel: cancel, done: make(chan struct{}), id: b.r.execSeq.Add(1)}
	// ExecStart's buffers: the result carries what they kept.
	keptOut, _ := stdout.(*headtail.Buffer)
	keptErr, _ := stderr.(*headtail.Buffer)
	for _, w := range []io.Writer{stdout, stderr} {
		if bp, ok := w.(*boundedpipe.Pipe); ok {
			p.pipes = append(p.pipes, bp)
		}
	}
	if b.r.opts.Observer != nil {
		stdout, stderr = execrun.Counting(stdout, &p.outBytes), execrun.Counting(stderr, &p.outBytes)
	}
	used := b.useBegin(ctx)
	if opts.Background {
		used() // its start was a use; its run is not
		used = func() {}
	}
	proc, err := c.Exec(callCtx, spec, stdout, stderr)
	if err != nil {
		used()
		cancel()
		return nil, b.callErr(err)
	}
	p.proc = proc
	b.r.execStarted(p, cmd, args) // before the waiter can report its end
	if opts.Stdin != nil {
		go execrun.CopyStdin(proc, opts.Stdin)
	}
	vmExit := b.vm.VMExit()
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
		unhealthy := func() {
			b.markUnhealthy(fmt.Sprintf("the agent did not report the end of %q within %s of its %s timeout", cmd, lim.Host()-lim.Timeout, lim.Timeout))
		}
		end := execrun.Wait(ctx, proc, lim, vmExit, unhealthy, cancel, p.pipes)
		p.ctxErr = end.CtxErr
		ex, err := end.Exit, end.Err
		res := &ExecResult{
			ExitCode: ex.Code, Signal: int(ex.Signal), TimedOut: ex.TimedOut, ErrorMessage: ex.Error,
			Duration: time.Since(p.t0), GuestDuration: time.Duration(ex.GuestNs),
			StdoutDropped: ex.StdoutDropped, StderrDropped: ex.StderrDropped, OOMKilled: ex.OOMKilled,
		}
		if end.HostTimedOut && err != nil {
			// What arrived is kept; the guest's word on the exit is not.
			res.TimedOut, res.ExitCode = true, -1
			res.ErrorMessage = fmt.Sprintf("timed out after %s; the box did not confirm the process ended within %s more and is marked unhealthy (Box.Unhealthy)", lim.Timeout, lim.Host()-lim.Timeout)
		}
		p.res, p.err = res, checkpoint.Of(b.dir).Ended(b.id, p.t0, end.Outcome(func() error { return b.deadErr(0) }, b.callErr))
	}()
	return p, nil
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
	if err := execrun.CheckSize(rows, cols); err != nil {
		return err
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
