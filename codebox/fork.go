package codebox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-run/airlock"
)

// A forkable context (ContextOptions.Forkable) runs its interpreter as a
// daemon of the box, not as the exec the host holds: its stdin and stdout
// are FIFOs in a directory of its own under kernelRunDir, opened
// read-write by the interpreter so that it never sees end-of-file or a
// broken pipe, and the host talks to it through a relay exec (two cats)
// that it can replace. When a box is forked, each child's guest still
// runs the interpreter, with its variables, but the relay's exec stream
// belonged to the parent's connection; the child's Context starts a new
// relay to the same FIFOs (reattach), which first kills what is left of
// the old relay.

// kernelRunDir holds one directory per forkable interpreter.
const kernelRunDir = "/tmp/.airlock-codebox/run"

// launchScript starts the interpreter daemon: $1 directory, $2 python,
// $3 kernel script. It prints the interpreter's pid.
const launchScript = `set -e
d=$1
mkdir -p "$d"
mkfifo -m 600 "$d/in" "$d/out"
setsid "$2" -u "$3" <>"$d/in" 1<>"$d/out" 2>"$d/err" &
echo $! >"$d/pid"
echo $!`

// relayScript connects the exec's stdin and stdout to the interpreter's
// FIFOs ($1 directory; $2 "attach" to join a running interpreter, which
// then prints no ready line: the relay does) and forwards SIGINT to it.
// When the interpreter exits, the relay prints the tail of its stderr.
const relayScript = `d=$1
k=$(cat "$d/pid") || exit 3
if [ -s "$d/relay" ]; then
	old=$(cat "$d/relay")
	kill -9 -- "-$old" 2>/dev/null
	i=0
	while kill -0 -- "-$old" 2>/dev/null && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done
fi
echo $$ >"$d/relay"
kill -0 "$k" 2>/dev/null || { tail -c 65536 "$d/err" >&2; exit 4; }
trap 'kill -INT "$k" 2>/dev/null' INT
exec 5<&0
cat <&5 >"$d/in" &
w=$!
[ "$2" = attach ] && printf '{"ready": true, "pid": %s}\n' "$k"
cat "$d/out" &
r=$!
while kill -0 "$r" 2>/dev/null; do wait "$r"; done
kill "$w" 2>/dev/null
tail -c 65536 "$d/err" >&2`

// daemonProc is a forkable interpreter as kernelProc: the relay's streams,
// signals forwarded by the relay, Kill through an exec of kill.
type daemonProc struct {
	box   *airlock.Box
	relay *airlock.Process
	dir   string
	pid   int
}

func (p *daemonProc) Stdin() io.WriteCloser { return &daemonStdin{p} }
func (p *daemonProc) Stdout() io.Reader     { return p.relay.Stdout() }
func (p *daemonProc) Stderr() io.Reader     { return p.relay.Stderr() }

// Signal sends SIGINT through the relay (its trap forwards it); other
// signals go to the interpreter through an exec of kill.
func (p *daemonProc) Signal(sig syscall.Signal) error {
	if sig == syscall.SIGINT {
		return p.relay.Signal(sig)
	}
	return p.kill(strconv.Itoa(int(sig)))
}

// Kill ends the interpreter (SIGKILL) and the relay.
func (p *daemonProc) Kill() error {
	err := p.kill("9")
	return errors.Join(err, p.relay.Kill())
}

func (p *daemonProc) kill(sig string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := p.box.Exec(ctx, "kill", []string{"-" + sig, strconv.Itoa(p.pid)}, airlock.ExecOptions{})
	return err
}

func (p *daemonProc) Wait() (int, error) {
	res, err := p.relay.Wait()
	if res == nil {
		return -1, err
	}
	return res.ExitCode, err
}

// daemonStdin is the relay's stdin; Close ends the interpreter (which,
// holding its FIFO open read-write, sees no end of input), and so the
// relay.
type daemonStdin struct{ p *daemonProc }

func (s *daemonStdin) Write(b []byte) (int, error) { return s.p.relay.Stdin().Write(b) }
func (s *daemonStdin) Close() error {
	err := s.p.kill("TERM")
	return errors.Join(err, s.p.relay.Stdin().Close())
}

// forkableStart returns a Context.start that launches a new interpreter
// daemon in c's box.
func (c *CodeBox) forkableStart(co ContextOptions) func(context.Context) (kernelProc, error) {
	return func(ctx context.Context) (kernelProc, error) {
		if err := c.writeFile(ctx, KernelPath, kernelSource); err != nil {
			return nil, err
		}
		var rnd [6]byte
		rand.Read(rnd[:])
		dir := kernelRunDir + "/" + hex.EncodeToString(rnd[:])
		res, err := c.box.Exec(ctx, "sh", []string{"-c", launchScript, "launch", dir, c.opts.Python, KernelPath},
			airlock.ExecOptions{Env: append([]string{"MPLBACKEND=Agg", "PYTHONIOENCODING=utf-8"}, co.Env...), WorkingDir: co.WorkingDir})
		if err != nil {
			return nil, err
		}
		pid, perr := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
		if res.ExitCode != 0 || perr != nil {
			return nil, fmt.Errorf("start the interpreter daemon: exit %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
		}
		return c.relay(ctx, dir, pid, "new")
	}
}

// relay starts a relay to the interpreter in dir.
func (c *CodeBox) relay(ctx context.Context, dir string, pid int, mode string) (kernelProc, error) {
	p, err := c.box.ExecStream(context.WithoutCancel(ctx), "sh", []string{"-c", relayScript, "relay", dir, mode}, airlock.ExecOptions{})
	if err != nil {
		return nil, err
	}
	return &daemonProc{box: c.box, relay: p, dir: dir, pid: pid}, nil
}

// ID returns the context's id: the same in the children of a
// CodeBox.Fork, where CodeBox.Context finds it.
func (x *Context) ID() string { return x.id }

// Context returns the context with id (Context.ID) of c, nil if none:
// after Fork, each child has the parent's contexts under their ids.
func (c *CodeBox) Context(id string) *Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.contexts {
		if k.id == id {
			return k
		}
	}
	return nil
}

// Fork forks the CodeBox's box into n children (airlock.Box.Fork: the box
// is paused while it is snapshotted) and returns a CodeBox for each, with
// the parent's contexts under the same ids (CodeBox.Context): each
// child's context is the parent's interpreter as it was at the fork, its
// variables, imports and functions included, running on independently.
// Every context must have been made with ContextOptions.Forkable; Fork
// waits for cells that are running. The children are not attached: Close
// removes each child's box, and, as for New, the next airlock.Open removes
// it once this program is gone (unless c was made by Attach). On error no
// child is left.
func (c *CodeBox) Fork(ctx context.Context, n int) ([]*CodeBox, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("codebox: closed")
	}
	ctxs := make([]*Context, 0, len(c.contexts))
	for k := range c.contexts {
		ctxs = append(ctxs, k)
	}
	c.mu.Unlock()
	// No cell runs while the box is snapshotted: nothing is in flight in
	// an interpreter's FIFOs.
	type state struct {
		x      *Context
		dir    string
		pid    int
		nextID int64
	}
	var states []state
	for _, x := range ctxs {
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.closed {
			continue
		}
		if !x.forkable {
			return nil, fmt.Errorf("codebox: context %s was not made forkable (ContextOptions.Forkable): its interpreter would not survive the fork", x.id)
		}
		s := state{x: x, nextID: x.nextID}
		if x.k != nil {
			dp := x.k.p.(*daemonProc)
			s.dir, s.pid = dp.dir, dp.pid
		}
		states = append(states, s)
	}
	// Like New's boxes, the children go with this program (unless the
	// CodeBox was attached to a box someone else manages).
	kids, err := c.box.ForkWith(ctx, n, airlock.ForkOptions{AutoRemove: !c.attached})
	if err != nil {
		return nil, fmt.Errorf("codebox: %w", err)
	}
	out := make([]*CodeBox, len(kids))
	fail := func(err error) ([]*CodeBox, error) {
		for i, k := range kids {
			if out[i] != nil {
				out[i].Close()
			} else {
				k.Remove(context.WithoutCancel(ctx), true)
			}
		}
		return nil, err
	}
	for i, kb := range kids {
		child := &CodeBox{box: kb, opts: c.opts, killGrace: c.killGrace, contexts: map[*Context]struct{}{}}
		out[i] = child
		for _, s := range states {
			x := child.newContextValue(s.x.id, s.x.co)
			x.nextID = s.nextID
			if s.dir != "" {
				k, err := startKernel(ctx, func(ctx context.Context) (kernelProc, error) {
					return child.relay(ctx, s.dir, s.pid, "attach")
				})
				if err != nil {
					return fail(fmt.Errorf("codebox: reattach context %s in fork child %s: %w", s.x.id, kb.ID(), err))
				}
				x.k = k
			}
			child.contexts[x] = struct{}{}
		}
	}
	return out, nil
}
