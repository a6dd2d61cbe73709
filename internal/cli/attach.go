package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airlock-run/airlock"
)

// forwarded are the signals `airlock run` and `exec` pass on to the
// command in the box, as `docker run` does.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// interruptsToKill is how many SIGINTs in a row make airlock kill the
// command instead of passing them on (for a command that ignores them).
const interruptsToKill = 3

// brokenPipeWriter notices the first failed write (a closed stdout: EPIPE).
type brokenPipeWriter struct {
	w      io.Writer
	once   sync.Once
	broken chan struct{}
}

func (b *brokenPipeWriter) Write(p []byte) (int, error) {
	n, err := b.w.Write(p)
	if err != nil {
		b.once.Do(func() { close(b.broken) })
	}
	return n, err
}

// terminal is the host terminal of an exec -t.
type terminal struct {
	fd    int
	state *term.State
}

// rawTerminal puts stdin in raw mode when it is a terminal (nil
// otherwise): keys, Ctrl-C included, then go to the box's PTY unchanged.
func rawTerminal(in io.Reader) (*terminal, error) {
	f, ok := in.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil, nil
	}
	fd := int(f.Fd())
	st, err := term.MakeRaw(fd)
	if err != nil {
		return nil, fmt.Errorf("put the terminal in raw mode: %w", err)
	}
	return &terminal{fd: fd, state: st}, nil
}

func (t *terminal) size() (rows, cols int) {
	cols, rows, err := term.GetSize(t.fd)
	if err != nil {
		return 0, 0
	}
	return rows, cols
}

func (t *terminal) restore() { term.Restore(t.fd, t.state) }

// attach runs argv in b with the command's streams: with -t on a host
// terminal in raw mode whose size (and every SIGWINCH) the box's PTY
// follows; signals airlock receives go to the command; a closed stdout
// kills the command. It returns the exit code the CLI ends with.
func attach(cmd *cobra.Command, b *airlock.Box, argv []string, opts airlock.ExecOptions, ef execFlags) (int, error) {
	// Signals are passed on, so they must not cancel the exec.
	ctx := context.WithoutCancel(cmd.Context())
	opts.Timeout = ef.timeout
	if ef.interactive {
		opts.Stdin = cmd.InOrStdin()
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, append(forwarded, syscall.SIGWINCH, syscall.SIGPIPE)...)
	defer signal.Stop(sigs)
	var tty *terminal
	if ef.tty {
		opts.TTY = true
		t, err := rawTerminal(cmd.InOrStdin())
		if err != nil {
			return 125, err
		}
		if t != nil {
			tty = t
			defer tty.restore()
			opts.Rows, opts.Cols = tty.size()
		}
	}
	// Without -t the box's output reaches a host terminal escaped (a pipe
	// or a file gets it unchanged); with -t it is the box's terminal, raw.
	termOut, termErr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	flushOut, flushErr := func() error { return nil }, func() error { return nil }
	if !ef.tty {
		termOut, flushOut = terminalSafe(termOut)
		termErr, flushErr = terminalSafe(termErr)
	}
	out := &brokenPipeWriter{w: termOut, broken: make(chan struct{})}
	var stdout, stderr io.Writer = out, termErr
	if ef.main {
		// The main command's output is also kept for airlock logs.
		if l, err := openMainLog(b); err == nil {
			ow, ew := &streamWriter{l: l, stream: "stdout"}, &streamWriter{l: l, stream: "stderr"}
			defer func() { ow.flush(); ew.flush(); l.Close() }()
			stdout, stderr = io.MultiWriter(stdout, ow), io.MultiWriter(stderr, ew)
		}
	}
	if opts.Stdin == nil {
		opts.Stdin = strings.NewReader("") // without -i: no input, as /dev/null
	}
	opts.Stdout, opts.Stderr, opts.Main = stdout, stderr, ef.main
	p, err := b.ExecStream(ctx, argv[0], argv[1:], opts)
	if err != nil {
		return 125, err
	}
	interrupts := 0
	killed, brokenPipe := false, false
	for done := false; !done; {
		select {
		case <-p.Done():
			done = true
		case <-out.broken:
			out.broken = nil
			brokenPipe = true
			p.Kill()
		case s := <-sigs:
			switch s {
			case syscall.SIGWINCH:
				if tty != nil {
					if rows, cols := tty.size(); rows > 0 {
						p.Resize(rows, cols)
					}
				}
			case syscall.SIGPIPE:
				// A write error says it (EPIPE).
			default:
				if s == syscall.SIGINT {
					interrupts++
					if interrupts >= interruptsToKill && !killed {
						killed = true
						fmt.Fprintf(cmd.ErrOrStderr(), "airlock: interrupted %d times; killing the command and its children\n", interrupts)
						p.Kill()
						continue
					}
				}
				p.Signal(s.(syscall.Signal))
			}
		}
	}
	res, err := p.Wait()
	// The command's last bytes before any line of airlock's own.
	flushOut()
	flushErr()
	if brokenPipe {
		// As a shell pipeline: the writer of a closed pipe dies of SIGPIPE.
		return 128 + int(syscall.SIGPIPE), nil
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return 130, nil
		}
		return 125, err
	}
	if res.OOMKilled {
		// One line of airlock's own, after the command's last byte.
		mem := ""
		if info, err := b.Info(ctx); err == nil {
			mem = fmt.Sprintf(" (it has %d MiB)", info.Options.MemoryMiB)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "airlock: out of memory: the box's OOM killer killed a process of the command; give the box more with --memory%s\n", mem)
	}
	if killed {
		return 130, nil
	}
	if res.TimedOut {
		fmt.Fprintf(cmd.ErrOrStderr(), "airlock: command timed out after %s; it and every process it started were killed\n", ef.timeout)
		return 124, nil
	}
	return res.ExitCode, nil
}
