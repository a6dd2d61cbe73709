package codebox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-run/airlock"
)

// parkedDir holds a parked kernel's FIFOs (in, out), its pid, its ready
// line and its stderr.
const parkedDir = "/tmp/.airlock-codebox/parked"

// parkScript starts the kernel detached from the exec that starts it (its
// own session; stdin and stdout are FIFOs opened read-write, so neither
// open blocks and the kernel outlives every reader and writer), waits for
// its ready line and keeps it in $d/ready. $1 is the interpreter, $2 the
// kernel script's path; the script comes on stdin. Exit status 98: the
// image has no such interpreter.
const parkScript = `set -e
command -v "$1" >/dev/null 2>&1 || exit 98
d=` + parkedDir + `
mkdir -p "$d"
cat > "$2"
rm -f "$d/in" "$d/out" "$d/ready"
mkfifo -m 600 "$d/in" "$d/out"
setsid "$1" -u "$2" <>"$d/in" 1<>"$d/out" 2>"$d/err" &
echo $! > "$d/pid"
IFS= read -r line < "$d/out" || true
case "$line" in
*'"ready"'*) printf '%s\n' "$line" > "$d/ready" ;;
*) echo "the parked interpreter did not start: $line $(cat "$d/err")" >&2; exit 1 ;;
esac`

// parkedRelayScript connects the exec's stdin and stdout to a parked kernel: it
// prints the kernel's ready line, copies stdin to the kernel's input and
// the kernel's output to stdout until the kernel exits, then prints the
// kernel's stderr. When the host closes stdin the kernel is ended (its
// input FIFO never reaches EOF by itself). Exit status 99: no kernel is
// parked here, or another relay took it (the ready file is renamed).
const parkedRelayScript = `d=` + parkedDir + `
[ -p "$d/in" ] && mv "$d/ready" "$d/ready.taken" 2>/dev/null || exit 99
k=$(cat "$d/pid")
cat "$d/ready.taken"
exec 3<&0
{ cat <&3 >"$d/in"; kill -TERM "$k" 2>/dev/null; } >/dev/null 2>&1 &
cat "$d/out"
cat "$d/err" >&2
exit 1`

// Pool returns the options of a warm pool (airlock.Options.Pool) of size
// boxes for CodeBoxes of opts, as New makes them (opts.BoxOptions, the
// default image when empty). Each pool box has a context interpreter
// already started, the kernel script imported and idle: the first
// NewContext of a CodeBox that New took from this pool (or of Attach on
// such a box, in the same process) adopts it, so its first Run costs a
// round trip to a running interpreter, not an interpreter start. The
// interpreter is started once in the pool's template box, before the
// snapshot; each restored box reseeds its random module.
//
// The pool serves airlock.Runtime.Create as well: boxes with the same
// options come from it, each with that idle interpreter running. An image
// without the interpreter gives a pool of plain boxes.
func Pool(opts Options, size int) airlock.PoolOptions {
	bo := opts.BoxOptions
	if bo.Image == "" {
		bo.Image = airlock.DefaultImage
	}
	python := opts.Python
	if python == "" {
		python = DefaultPython
	}
	return airlock.PoolOptions{
		BoxOptions: bo,
		Size:       size,
		Prepare:    func(ctx context.Context, b *airlock.Box) error { return park(ctx, b, python) },
		Warm: func(ctx context.Context, b *airlock.Box) (any, error) {
			pk, err := attachParked(ctx, b, python)
			if pk == nil {
				return nil, err // not a typed nil
			}
			return pk, nil
		},
	}
}

// park starts a kernel in b, detached, for a later attachParked.
func park(ctx context.Context, b *airlock.Box, python string) error {
	res, err := b.Exec(ctx, "sh", []string{"-c", parkScript, "sh", python, KernelPath},
		airlock.ExecOptions{Stdin: bytes.NewReader(kernelSource), Timeout: kernelStartTimeout,
			Env: []string{"MPLBACKEND=Agg", "PYTHONIOENCODING=utf-8"}})
	if err != nil {
		return fmt.Errorf("park a Python kernel: %w", err)
	}
	if res.ExitCode == 98 {
		return nil // no Python in the image: the pool's boxes are plain boxes
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("park a Python kernel: exit status %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}

// reseedCell reseeds the random module in a kernel that was started
// before a snapshot: every box restored from it would otherwise draw the
// same numbers (its state was seeded when the template's kernel started).
const reseedCell = `__import__("random").seed()`

// parkedKernel is a kernel started by park, reached through a relay exec
// started by attachParked; it is a kernelProc for the first context of
// the CodeBox that claims the box.
type parkedKernel struct {
	box    *airlock.Box
	python string // the interpreter it runs (Options.Python)
	relay  *airlock.Process
	pid    int
	out    io.Reader // the ready line, then the relay's stdout
}

// attachParked starts the relay to b's parked kernel and reseeds its
// random module; ctx bounds only that. It returns nil, nil when no kernel
// is parked in b (its image has no such interpreter).
func attachParked(ctx context.Context, b *airlock.Box, python string) (*parkedKernel, error) {
	p, err := b.ExecStream(context.WithoutCancel(ctx), "sh", []string{"-c", parkedRelayScript}, airlock.ExecOptions{})
	if err != nil {
		return nil, err
	}
	pk := &parkedKernel{box: b, python: python, relay: p}
	type line struct {
		b   []byte
		err error
	}
	br := bufio.NewReaderSize(p.Stdout(), 64<<10)
	lines := make(chan line, 1)
	read := func() {
		l, _, err := readMessage(br, maxMessage)
		lines <- line{l, err}
	}
	next := func() ([]byte, error) {
		go read()
		t := time.NewTimer(kernelStartTimeout)
		defer t.Stop()
		select {
		case l := <-lines:
			return l.b, l.err
		case <-ctx.Done():
			p.Kill()
			return nil, ctx.Err()
		case <-t.C:
			p.Kill()
			return nil, errors.New("the parked interpreter did not answer")
		}
	}
	fail := func(err error) (*parkedKernel, error) {
		pk.Kill()
		if res, werr := p.Wait(); werr == nil && res.ExitCode == 99 {
			return nil, nil // none parked (no Python in the image): a plain box
		}
		return nil, fmt.Errorf("attach the parked Python kernel: %w", err)
	}
	ready, err := next()
	if err != nil {
		return fail(err)
	}
	var rep struct {
		Ready bool `json:"ready"`
		PID   int  `json:"pid"`
	}
	if json.Unmarshal(ready, &rep) != nil || !rep.Ready || rep.PID <= 0 {
		return fail(fmt.Errorf("unexpected first line %q", ready))
	}
	pk.pid = rep.PID
	req, _ := json.Marshal(map[string]any{"id": 0, "code": reseedCell})
	if _, err := p.Stdin().Write(append(req, '\n')); err != nil {
		return fail(err)
	}
	for {
		l, err := next()
		if err != nil {
			return fail(err)
		}
		var r reply
		if json.Unmarshal(l, &r) == nil && r.ID != nil && *r.ID == 0 {
			if r.Error != nil {
				return fail(fmt.Errorf("reseed its random module: %s", r.Error.Error()))
			}
			break
		}
	}
	pk.out = io.MultiReader(bytes.NewReader(ready), br)
	return pk, nil
}

// Stdin is the kernel's input (through the relay).
func (k *parkedKernel) Stdin() io.WriteCloser { return k.relay.Stdin() }

// Stdout is the kernel's ready line, then its output.
func (k *parkedKernel) Stdout() io.Reader { return k.out }

// Stderr is the relay's: the kernel's stderr once it has exited.
func (k *parkedKernel) Stderr() io.Reader { return k.relay.Stderr() }

// Signal sends sig to the kernel (not to the relay).
func (k *parkedKernel) Signal(sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := k.box.Exec(ctx, "kill", []string{"-s", strconv.Itoa(int(sig)), strconv.Itoa(k.pid)}, airlock.ExecOptions{})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("kill %d: %s", k.pid, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}

// Kill ends the kernel and the relay.
func (k *parkedKernel) Kill() error {
	if k.pid > 0 {
		k.Signal(syscall.SIGKILL)
	}
	return k.relay.Kill()
}

// Wait waits for the relay, which ends when the kernel does.
func (k *parkedKernel) Wait() (int, error) {
	res, err := k.relay.Wait()
	if res == nil {
		return -1, err
	}
	return res.ExitCode, err
}

// takeParked returns, once, the kernel parked in a box taken from a
// codebox pool, for a context with default options co and the same
// interpreter; nil otherwise (a kernel not taken stays idle in the box).
func (c *CodeBox) takeParked(co ContextOptions) kernelProc {
	if co.WorkingDir != "" || len(co.Env) > 0 {
		return nil
	}
	if pk, ok := c.box.TakeWarm().(*parkedKernel); ok {
		if pk.python == c.opts.Python {
			return pk
		}
		pk.Kill()
	}
	return nil
}
