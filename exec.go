package airlock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
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
		Env:        mergeEnv(cfg.Image.Env, cfg.Options.Env, opts.Env),
		WorkingDir: firstNonEmpty(opts.WorkingDir, cfg.Options.WorkingDir, cfg.Image.WorkingDir, "/"),
		User:       firstNonEmpty(opts.User, cfg.Options.User, cfg.Image.User),
		Stdin:      stdin,
		Timeout:    opts.Timeout,
		KillGrace:  opts.KillGrace,
	}
}

// DefaultCommand returns the image's default argv (Entrypoint + Cmd, as
// Docker combines them); empty when the image defines neither.
func (b *Box) DefaultCommand() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append(append([]string(nil), b.cfg.Image.Entrypoint...), b.cfg.Image.Cmd...)
}

// Exec runs cmd with args in the box and waits for it to finish. cmd is
// looked up in the box's PATH like a shell would. A non-zero exit status is
// reported in ExecResult, not as an error; so is a timeout (TimedOut). The
// error is non-nil only when the exec could not be carried out: the box is
// not running (ErrBoxNotRunning), its VM died (ErrBoxDied, with the cause
// and the console's tail), or ctx was cancelled (ctx.Err(), after the
// process tree was killed). Output is returned byte for byte.
func (b *Box) Exec(ctx context.Context, cmd string, args []string, opts ExecOptions) (*ExecResult, error) {
	var out, errb bytes.Buffer
	p, err := b.start(ctx, cmd, args, opts, &out, &errb, opts.Stdin != nil)
	if err != nil {
		return nil, err
	}
	if opts.Stdin != nil {
		go p.copyStdin(opts.Stdin)
	}
	res, err := p.Wait()
	if res != nil {
		res.Stdout, res.Stderr = out.Bytes(), errb.Bytes()
	}
	return res, err
}

// ExecStream starts cmd and returns at once. Read its output from
// Process.Stdout and Process.Stderr while it runs (or use ExecStreamWriters
// to have it written to writers); each stream is buffered up to 1 MiB, past
// that the guest process is paused until the caller reads, so a command
// printing gigabytes does not grow host memory. Write to Process.Stdin (when
// opts.Stdin is nil). Call Wait for the result; see Exec for errors.
func (b *Box) ExecStream(ctx context.Context, cmd string, args []string, opts ExecOptions) (*Process, error) {
	outR, outW := newBoundedPipe(1 << 20)
	errR, errW := newBoundedPipe(1 << 20)
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
func (b *Box) ExecStreamWriters(ctx context.Context, cmd string, args []string, opts ExecOptions, stdout, stderr io.Writer) (*Process, error) {
	p, err := b.start(ctx, cmd, args, opts, stdout, stderr, opts.Stdin != nil)
	if err != nil {
		return nil, err
	}
	if opts.Stdin != nil {
		go p.copyStdin(opts.Stdin)
	}
	return p, nil
}

// Process is a running exec started by ExecStream.
type Process struct {
	b      *Box
	proc   *client.Proc
	t0     time.Time
	stdout io.Reader
	stderr io.Reader
	pipes  []*boundedPipe
	cancel context.CancelFunc
	done   chan struct{}
	res    *ExecResult
	err    error
	ctxErr error
}

func (b *Box) start(ctx context.Context, cmd string, args []string, opts ExecOptions, stdout, stderr io.Writer, stdin bool) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	spec := b.spec(cmd, args, opts, stdin)
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
	for _, w := range []io.Writer{stdout, stderr} {
		if bp, ok := w.(*boundedPipe); ok {
			p.pipes = append(p.pipes, bp)
		}
	}
	proc, err := c.Exec(callCtx, spec, stdout, stderr)
	if err != nil {
		cancel()
		return nil, b.callErr(err)
	}
	p.proc = proc
	b.mu.Lock()
	vmExit := b.vmExit
	b.mu.Unlock()
	go func() {
		defer close(p.done)
		defer cancel()
		gone := false
		select {
		case <-proc.Done():
		case <-ctx.Done():
			if fromDeadline && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The agent's timer fires at the same moment.
				select {
				case <-proc.Done():
				case <-time.After(grace + 5*time.Second):
					p.ctxErr = ctx.Err()
				}
			} else {
				p.ctxErr = ctx.Err()
				proc.Kill()
				select {
				case <-proc.Done():
				case <-time.After(5 * time.Second):
				}
			}
		case <-vmExit:
			gone = true
		}
		cancel()
		if gone || p.ctxErr != nil {
			// The call is over: a caller who stopped reading must not keep
			// the receiver blocked on a full pipe (Wait would hang).
			for _, bp := range p.pipes {
				bp.dropWrites()
			}
		}
		ex, err := proc.Wait()
		for _, bp := range p.pipes {
			bp.CloseWrite()
		}
		res := &ExecResult{
			ExitCode: ex.Code, Signal: int(ex.Signal), TimedOut: ex.TimedOut, ErrorMessage: ex.Error,
			Duration: time.Since(p.t0), GuestDuration: time.Duration(ex.GuestNs),
		}
		switch {
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
	b.mu.Lock()
	if b.conn != nil {
		select {
		case <-b.conn.Done():
			b.conn = nil
		default:
		}
	}
	b.mu.Unlock()
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
