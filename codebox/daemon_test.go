package codebox

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostRelay runs relayScript on the host (trusted test code only), as the
// agent runs an exec: its own process group. Kill and Close run
// signalScript as daemonProc does through the box.
type hostRelay struct {
	hostProc
	dir string
}

func (p *hostRelay) signal(sig string) error {
	return exec.Command("sh", "-c", signalScript, "signal", p.dir, sig).Run()
}
func (p *hostRelay) Kill() error {
	return errors.Join(p.signal("KILL"), p.cmd.Process.Kill())
}
func (p *hostRelay) Stdin() io.WriteCloser { return hostRelayStdin{p} }

type hostRelayStdin struct{ p *hostRelay }

func (s hostRelayStdin) Write(b []byte) (int, error) { return s.p.in.Write(b) }
func (s hostRelayStdin) Close() error                { return errors.Join(s.p.signal("TERM"), s.p.in.Close()) }

func startHostRelay(t *testing.T, dir string) (*hostRelay, error) {
	cmd := exec.Command("sh", "-c", relayScript, "relay", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	errp, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &hostRelay{hostProc{cmd: cmd, in: in, stdout: out, stderr: errp}, dir}, nil
}

// alive reports whether pid runs (a zombie does not: this host's pid 1
// may be slow to reap orphans).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// TestDaemonScriptsHost drives launchScript, relayScript and signalScript
// with the host's sh and python3: the daemon's ready line, a second relay
// that takes over from the first (as in a fork child) with the state
// kept, the reseed request (no cell counted), SIGINT through the relay,
// the exit status and stderr tail of an interpreter that exits, and Close
// killing the daemon and removing its directory.
func TestDaemonScriptsHost(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed on the host")
	}
	for _, tool := range []string{"setsid", "mkfifo"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed on the host", tool)
		}
	}
	tmp := t.TempDir()
	script := filepath.Join(tmp, "k", "kernel.py")
	launch := func(dir string) {
		t.Helper()
		// A failed test leaves no daemon on the host.
		t.Cleanup(func() { exec.Command("sh", "-c", signalScript, "signal", dir, "KILL").Run() })
		cmd := exec.Command("sh", "-c", launchScript, "launch", dir, py, script)
		cmd.Stdin = strings.NewReader(string(kernelSource))
		out, err := cmd.Output()
		if err != nil || !strings.Contains(string(out), `"ready"`) {
			t.Fatalf("launch: %q %v", out, err)
		}
	}
	dir := filepath.Join(tmp, "run", "a")
	launch(dir)
	var relays []*hostRelay
	x := &Context{closing: make(chan struct{}), timeout: 2 * time.Second, grace: 2 * time.Second,
		start: func(context.Context) (kernelProc, error) {
			r, err := startHostRelay(t, dir)
			if err == nil {
				relays = append(relays, r)
			}
			return r, err
		}}
	if err := x.init(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	b, _ := os.ReadFile(filepath.Join(dir, "pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if !alive(pid) {
		t.Fatalf("no interpreter daemon (pid %q)", b)
	}
	run(t, x, "x = 41")
	// A second relay takes over (a fork child's reattach): the first one's
	// group is killed, the state stays; the reseed is not a cell.
	k2, err := startKernel(context.Background(), x.start)
	if err != nil {
		t.Fatal(err)
	}
	if err := k2.reseed(context.Background()); err != nil {
		t.Fatalf("reseed: %v; relay stderr %q", err, k2.stderr.String())
	}
	select {
	case <-x.k.exited: // the first relay was killed
	case <-time.After(10 * time.Second):
		t.Fatal("the first relay is still running")
	}
	x.k = k2
	if res := run(t, x, "x + 1"); res.Value != "42" {
		t.Fatalf("after the reattach: %+v", res)
	}
	if res := run(t, x, "1/0"); res.Error == nil || !strings.Contains(res.Error.Traceback, "<cell-3>") {
		t.Fatalf("cells numbered from 1 with the reseed not counted: %+v", res.Error)
	}
	// SIGINT through the relay's trap: the cell stops, the state stays.
	if res := run(t, x, "import time\ntime.sleep(30)"); !res.TimedOut || res.StateLost {
		t.Fatalf("interrupt: %+v", res)
	}
	// An interpreter that exits: its status and stderr reach the host, a
	// new one is started (in the same directory here: x.start reattaches,
	// which launches nothing, so it fails and the Run says so).
	res, err := x.Run(context.Background(), "import os, sys\nos.write(sys.modules['__main__']._saved_err, b'bye\\n')\nos._exit(7)")
	if res == nil || res.Error == nil || res.Error.Name != "KernelDied" || !strings.Contains(res.Error.Value, "status 7") ||
		!strings.Contains(res.Error.Value, "bye") {
		t.Fatalf("exit: %+v %v", res, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) || alive(pid) {
		t.Fatalf("after the exit: dir %v, pid alive %v", err, alive(pid))
	}

	// Close kills the daemon and removes its directory.
	dir = filepath.Join(tmp, "run", "b")
	launch(dir)
	y := &Context{closing: make(chan struct{}), grace: time.Second, start: x.start}
	if err := y.init(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(filepath.Join(dir, "pid"))
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	run(t, y, "import subprocess; p = subprocess.Popen(['sleep', '600'])")
	child := run(t, y, "p.pid").Value
	t0 := time.Now()
	y.Close()
	cpid, _ := strconv.Atoi(child)
	time.Sleep(100 * time.Millisecond)
	if alive(pid) || alive(cpid) {
		t.Errorf("after Close: interpreter alive %v, its child alive %v", alive(pid), alive(cpid))
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("after Close: %s is still there (%v)", dir, err)
	}
	if d := time.Since(t0); d > 1500*time.Millisecond {
		t.Errorf("Close took %s", d)
	}
}
