package codebox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-run/airlock"
)

// Every context's interpreter is a daemon of the box, not the exec the
// host holds: launchScript starts it in its own session with stdin and
// stdout on FIFOs in a directory of its own under kernelRunDir, opened
// read-write by it so that it never sees end-of-file or a broken pipe, and
// the host talks to it through a relay exec (relayScript: two cats) that
// can be replaced. An exec's processes die with its stream, and every
// stream dies with the host's connection; the daemon does not, so it
// lives on in what is restored from a snapshot of its box:
//
//   - CodeBox.Fork: each child's guest runs the parent's interpreter, and
//     the child's Context starts a new relay to the same FIFOs (the old
//     relay's remains are killed first);
//   - codebox.Pool: each pool box launches its own interpreter once it is
//     restored (one launched in the template would give every pool box
//     the same str hash seed) and gets a relay before it is claimed; the
//     claimer's first context adopts it.
//
// Both send a reseed request after the relay is attached (attachKernel):
// a fork child's interpreter must not draw what its siblings draw, and in
// both it runs the cell path once before the user's first cell. The daemon dies with its box, and Context.Close (or a
// kill after a timeout) kills its process group.

// kernelRunDir holds one directory per interpreter.
const kernelRunDir = "/tmp/.airlock-codebox/run"

// launchScript starts an interpreter daemon: $1 its directory, $2 the
// interpreter, $3 the kernel script's path, written from stdin. A wrapper
// shell leads the daemon's session (its pid, in $1/group, is the process
// group Kill ends) and records the interpreter's exit status in
// $1/status. The script waits for the kernel's ready line and prints it;
// exit status 98: no such interpreter in the box.
const launchScript = `command -v "$2" >/dev/null 2>&1 || { echo "no $2 in the box's PATH" >&2; exit 98; }
for t in setsid mkfifo cat tail; do
	command -v $t >/dev/null 2>&1 || { echo "the image has no $t (codebox contexts need sh, setsid, mkfifo, cat and tail)" >&2; exit 97; }
done
set -e
d=$1
mkdir -p "$d" "${3%/*}"
cat >"$3.$$"
mv -f "$3.$$" "$3"
mkfifo -m 600 "$d/in" "$d/out"
setsid sh -c '"$2" -u "$3" <>"$1/in" 1<>"$1/out" 2>"$1/err" & echo $! >"$1/pid"; wait $!; echo $? >"$1/status"' kernel "$d" "$2" "$3" </dev/null >/dev/null 2>&1 &
echo $! >"$d/group"
IFS= read -r line <"$d/out" || true
case $line in
*'"ready"'*) printf '%s\n' "$line" ;;
*)
	kill -9 "-$(cat "$d/group")" 2>/dev/null || true
	echo "the interpreter did not start: $(tail -c 65536 "$d/err")" >&2
	rm -rf "$d"
	exit 1 ;;
esac`

// relayScript connects the exec's stdin and stdout to the interpreter's
// FIFOs ($1 its directory) after killing an earlier relay's remains,
// prints a ready line and forwards SIGINT to the interpreter. When the
// interpreter exits it prints the tail of its stderr, removes the
// directory and exits with the interpreter's exit status.
const relayScript = `d=$1
k=$(cat "$d/pid" 2>/dev/null) || { echo "no interpreter in $d" >&2; exit 3; }
g=$(cat "$d/group")
if [ -s "$d/relay" ]; then
	old=$(cat "$d/relay")
	kill -9 "-$old" 2>/dev/null
	i=0
	while kill -0 "-$old" 2>/dev/null && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done
fi
echo $$ >"$d/relay"
trap 'kill -INT "$k" 2>/dev/null' INT
if kill -0 "$k" 2>/dev/null; then
	exec 5<&0 6<>"$d/out" 7<"$d/out" 6>&-
	cat <&5 1<>"$d/in" &
	w=$!
	printf '{"ready": true, "pid": %s}\n' "$k"
	cat <&7 &
	r=$!
	while kill -0 "$r" 2>/dev/null; do wait "$r"; done
	kill "$w" 2>/dev/null
fi
i=0
while [ ! -s "$d/status" ] && kill -0 "$g" 2>/dev/null && [ $i -lt 30 ]; do sleep 0.01; i=$((i+1)); done
s=$(cat "$d/status" 2>/dev/null) || s=255
tail -c 65536 "$d/err" >&2
rm -rf "$d"
exit "$s"`

// signalScript sends signal $2 (a name or number) to the process group
// of the daemon in $1; KILL also removes $1.
const signalScript = `g=$(cat "$1/group") && kill -"$2" "-$g" 2>/dev/null
[ "$2" != KILL ] || rm -rf "$1"`

// daemonProc is an interpreter daemon as kernelProc: the relay's streams,
// SIGINT through the relay, other signals through an exec of signalScript.
type daemonProc struct {
	box   *airlock.Box
	relay *airlock.Process
	dir   string
}

func (p *daemonProc) Stdin() io.WriteCloser { return &daemonStdin{p} }
func (p *daemonProc) Stdout() io.Reader     { return p.relay.Stdout() }
func (p *daemonProc) Stderr() io.Reader     { return p.relay.Stderr() }

// Signal sends SIGINT through the relay (its trap forwards it to the
// interpreter); other signals go to the daemon's process group.
func (p *daemonProc) Signal(sig syscall.Signal) error {
	if sig == syscall.SIGINT {
		return p.relay.Signal(sig)
	}
	return p.signal(strconv.Itoa(int(sig)))
}

// Kill ends the daemon's process group (SIGKILL) and the relay.
func (p *daemonProc) Kill() error {
	return errors.Join(p.signal("KILL"), p.relay.Kill())
}

func (p *daemonProc) signal(sig string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := p.box.Exec(ctx, "sh", []string{"-c", signalScript, "signal", p.dir, sig}, airlock.ExecOptions{})
	return err
}

// Wait returns the relay's exit status: the interpreter's (255 when it
// is not known: the daemon was killed).
func (p *daemonProc) Wait() (int, error) {
	res, err := p.relay.Wait()
	if res == nil {
		return -1, err
	}
	return res.ExitCode, err
}

// daemonStdin is the relay's stdin. Close ends the daemon (SIGTERM to its
// process group: holding its FIFO read-write, the interpreter sees no end
// of input), and so the relay.
type daemonStdin struct{ p *daemonProc }

func (s *daemonStdin) Write(b []byte) (int, error) { return s.p.relay.Stdin().Write(b) }
func (s *daemonStdin) Close() error {
	return errors.Join(s.p.signal("TERM"), s.p.relay.Stdin().Close())
}

// errNoPython is launchKernel's error when the box has no such
// interpreter.
var errNoPython = errors.New("no such interpreter")

// launchKernel starts an interpreter daemon of python in b, in dir, with
// co's working directory and environment, and waits for its ready line.
// ctx bounds the start (the launch exec: when it ends early, the agent
// kills what it started).
func launchKernel(ctx context.Context, b *airlock.Box, python, dir string, co ContextOptions) error {
	res, err := b.Exec(ctx, "sh", []string{"-c", launchScript, "launch", dir, python, KernelPath},
		airlock.ExecOptions{Stdin: strings.NewReader(string(kernelSource)), Timeout: kernelStartTimeout,
			Env: append([]string{"MPLBACKEND=Agg", "PYTHONIOENCODING=utf-8"}, co.Env...), WorkingDir: co.WorkingDir})
	if err != nil {
		return err
	}
	msg := strings.TrimSpace(string(res.Stderr))
	switch {
	case res.ExitCode == 98:
		return fmt.Errorf("%w: %s", errNoPython, msg)
	case res.ExitCode != 0 || res.TimedOut:
		if res.TimedOut {
			msg = fmt.Sprintf("python did not start within %s", kernelStartTimeout)
		}
		return fmt.Errorf("start the interpreter: exit status %d: %s", res.ExitCode, msg)
	}
	return nil
}

// relayKernel starts a relay to the interpreter daemon in dir of b.
func relayKernel(ctx context.Context, b *airlock.Box, dir string) (kernelProc, error) {
	// The relay must outlive ctx: a deadline on an ExecStream's ctx would
	// become the process's timeout.
	p, err := b.ExecStream(context.WithoutCancel(ctx), "sh", []string{"-c", relayScript, "relay", dir}, airlock.ExecOptions{Background: true})
	if err != nil {
		return nil, err
	}
	return &daemonProc{box: b, relay: p, dir: dir}, nil
}

// attachKernel attaches to the running interpreter daemon in dir of b (a
// fork child's, which lived through a snapshot, or a pool box's) and
// reseeds its random module, as os.fork does: every box restored from a
// snapshot would otherwise draw the same numbers. ctx bounds the call; on
// error the daemon is killed.
func attachKernel(ctx context.Context, b *airlock.Box, dir string) (*kernel, error) {
	k, err := startKernel(ctx, func(ctx context.Context) (kernelProc, error) { return relayKernel(ctx, b, dir) })
	if err != nil {
		return nil, err
	}
	if err := k.reseed(ctx); err != nil {
		k.kill()
		return nil, fmt.Errorf("reseed its random module: %w", err)
	}
	return k, nil
}

// reseed sends the kernel a reseed request (kernel.py: random and
// tempfile's name generator get fresh seeds, in a cell that is not
// counted; under TCG it also has a restored QEMU translate the cell path
// before the user's first cell: 17-22 ms to a pool CodeBox's first result
// against ~58 ms without) and waits for its reply.
func (k *kernel) reseed(ctx context.Context) error {
	if _, err := k.stdin.Write([]byte(`{"id": 0, "reseed": true}` + "\n")); err != nil {
		return err
	}
	t := time.NewTimer(kernelStartTimeout)
	defer t.Stop()
	for {
		select {
		case rep, ok := <-k.replies:
			if !ok {
				return errors.New(k.died())
			}
			if rep.ID == nil || *rep.ID != 0 {
				continue
			}
			if rep.Error != nil {
				return rep.Error
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return errors.New("the interpreter did not answer")
		}
	}
}
