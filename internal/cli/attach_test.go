package cli_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/vmtest"
)

func (c cli) command(args ...string) *exec.Cmd {
	cmd := exec.Command(airlockBin, args...)
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+c.home, "AIRLOCK_IMAGES="+vmtest.ImagesDir())
	return cmd
}

// hostPTY opens a pseudo-terminal on the host (a real one, as a user's
// terminal emulator would), rows x cols.
func hostPTY(t *testing.T, rows, cols int) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no PTY on this host: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.IoctlSetWinsize(int(s.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// expect reads the terminal until want appears (or fails after 30 s).
func expect(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("terminal closed before %q", want)
			}
			if strings.Contains(l, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no %q on the terminal after 30 s", want)
		}
	}
}

const ttyScript = `
import os, signal, sys, time
def winch(*a):
    s = os.get_terminal_size()
    os.write(1, b"winch %dx%d\n" % (s.lines, s.columns))
def intr(*a):
    os.write(1, b"sigint\n")
    os._exit(5)
signal.signal(signal.SIGWINCH, winch)
signal.signal(signal.SIGINT, intr)
s = os.get_terminal_size()
print("size %dx%d tty %s" % (s.lines, s.columns, os.isatty(0)), flush=True)
print("ready", flush=True)
while True:
    time.sleep(0.05)
`

// TestCLIInteractive shares one box: exec -it through a real PTY (size,
// resize, Ctrl-C), signals without a TTY, and a closed stdout.
func TestCLIInteractive(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	id, errs, code := c.run("create", "--network", "disabled", "python:slim")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errs)
	}
	id = strings.TrimSpace(id)
	t.Cleanup(func() { c.run("rm", "-f", id) })

	t.Run("exec -it: size, resize, Ctrl-C", func(t *testing.T) {
		m, s := hostPTY(t, 33, 101)
		cmd := c.command("exec", "-it", id, "python3", "-c", ttyScript)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		before, _ := unix.IoctlGetTermios(int(s.Fd()), unix.TCGETS)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(m)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		expect(t, lines, "size 33x101 tty True")
		expect(t, lines, "ready")
		// The terminal is resized: the kernel sends airlock SIGWINCH.
		unix.IoctlSetWinsize(int(m.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 40, Col: 120})
		expect(t, lines, "winch 40x120")
		m.Write([]byte{3}) // Ctrl-C
		expect(t, lines, "sigint")
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 5 {
			t.Fatalf("exit: %v (want the command's status 5)", err)
		}
		after, _ := unix.IoctlGetTermios(int(s.Fd()), unix.TCGETS)
		if before != nil && after != nil && (after.Lflag != before.Lflag || after.Iflag != before.Iflag) {
			t.Errorf("terminal not restored: lflag %#x -> %#x", before.Lflag, after.Lflag)
		}
		if out, errs, code := c.run("exec", id, "echo", "alive"); code != 0 || out != "alive\n" {
			t.Fatalf("box after Ctrl-C: %d %q %s", code, out, errs)
		}
	})

	t.Run("SIGTERM reaches the command; its status is airlock's", func(t *testing.T) {
		cmd := c.command("exec", id, "sh", "-c", `trap 'echo got TERM; exit 7' TERM; echo ready; sleep 30 & wait`)
		var out bytes.Buffer
		r, w, _ := os.Pipe()
		cmd.Stdout = w
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		sc := bufio.NewScanner(r)
		if !sc.Scan() || sc.Text() != "ready" {
			t.Fatalf("no ready line: %q", sc.Text())
		}
		cmd.Process.Signal(syscall.SIGTERM)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
		}
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 || out.String() != "got TERM\n" {
			t.Fatalf("exit %v, output %q (want 7, got TERM)", err, out.String())
		}
	})

	t.Run("run --rm: SIGTERM and a closed stdout remove the box", func(t *testing.T) {
		home := t.TempDir()
		rc := cli{t, home}
		cmd := rc.command("run", "--rm", "--network", "disabled", "python:slim", "sh", "-c", `trap 'exit 9' TERM; echo ready; sleep 60 & wait`)
		r, w, _ := os.Pipe()
		cmd.Stdout = w
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		sc := bufio.NewScanner(r)
		if !sc.Scan() {
			cmd.Wait()
			t.Fatalf("no ready line; stderr: %s", stderr.String())
		}
		cmd.Process.Signal(syscall.SIGTERM)
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 9 {
			t.Fatalf("exit %v (want 9)", err)
		}
		if ls, _, _ := rc.run("ls", "-q"); ls != "" || len(qemuOf(home)) != 0 {
			t.Fatalf("box left after SIGTERM: %q %v", ls, qemuOf(home))
		}
		// yes | head -1: the pipeline ends, the box goes with it.
		t0 := time.Now()
		sh := exec.Command("sh", "-c", strconv.Quote(airlockBin)+" run --rm --network disabled python:slim yes | head -1")
		sh.Env = append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+vmtest.ImagesDir())
		done := make(chan struct{})
		var out []byte
		go func() { out, _ = sh.Output(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			sh.Process.Kill()
			t.Fatal("yes | head -1 did not end within 60 s")
		}
		if string(out) != "y\n" {
			t.Errorf("output %q", out)
		}
		// head exits first; airlock may still be removing the box.
		deadline := time.Now().Add(20 * time.Second)
		for len(qemuOf(home)) != 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if ls, _, _ := rc.run("ls", "-q"); ls != "" || len(qemuOf(home)) != 0 {
			t.Fatalf("box left after a closed stdout: %q %v", ls, qemuOf(home))
		}
		t.Logf("yes | head -1 with run --rm: %v, box gone", time.Since(t0).Round(10*time.Millisecond))

	})
}

// TestHostileGuestTerminalCLI: a box's command prints an OSC 52 clipboard
// write and a screen clear. `exec` (no -t) and `logs` show them on the
// user's terminal as text (\x1b...), never as sequences the terminal
// obeys; a pipe gets the bytes unchanged; `exec -t` (the box's own
// terminal, asked for) passes them raw. One box for all of it.
func TestHostileGuestTerminalCLI(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	const evil = `printf 'a\033]52;c;ZXZpbA==\007b\033[2Jc\n'`
	id, errs, code := c.run("run", "-d", "--network", "disabled", "python:slim", "sh", "-c", evil+"; sleep 600")
	if code != 0 {
		t.Fatalf("run -d: %d %s", code, errs)
	}
	id = strings.TrimSpace(id)
	t.Cleanup(func() { c.run("rm", "-f", id) })
	const escaped, raw = `a\x1b]52;c;ZXZpbA==\x07b\x1b[2Jc`, "a\x1b]52;c;ZXZpbA==\ab\x1b[2Jc"
	onTerminal := func(args ...string) string {
		t.Helper()
		m, s := hostPTY(t, 24, 80)
		cmd := c.command(args...)
		cmd.Stdout, cmd.Stderr = s, s
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		var got bytes.Buffer
		done := make(chan struct{})
		go func() { got.ReadFrom(m); close(done) }()
		if err := cmd.Wait(); err != nil {
			t.Errorf("%v: %v", args, err)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			m.Close()
			<-done
		}
		return got.String()
	}
	for _, args := range [][]string{{"exec", id, "sh", "-c", evil}, {"exec", id, "sh", "-c", evil + " >&2"}, {"logs", id}} {
		got := onTerminal(args...)
		for deadline := time.Now().Add(10 * time.Second); got == "" && args[0] == "logs" && time.Now().Before(deadline); {
			time.Sleep(200 * time.Millisecond) // the main command's output is logged as it comes
			got = onTerminal(args...)
		}
		if strings.ContainsAny(got, "\x1b\x07") || !strings.Contains(got, escaped) {
			t.Errorf("%v on a terminal showed %q, want %q as text", args, got, escaped)
		}
	}
	if got := onTerminal("exec", "-t", id, "sh", "-c", evil); !strings.Contains(got, raw) {
		t.Errorf("exec -t on a terminal showed %q, want the box's bytes %q", got, raw)
	}
	if out, _, code := c.run("exec", id, "sh", "-c", evil); code != 0 || out != raw+"\n" {
		t.Errorf("exec into a pipe: %d %q, want the box's bytes %q", code, out, raw+"\n")
	}
}
