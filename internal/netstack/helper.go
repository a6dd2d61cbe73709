package netstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// HelperConfig is what the helper process (cmd/airlock-net) reads from its
// config file.
type HelperConfig struct {
	Policy  Policy    `json:"policy"`
	Publish []Publish `json:"publish,omitempty"`
	// Upstream: see Config.Upstream.
	Upstream string `json:"upstream,omitempty"`
	// NetSocket is the unix socket QEMU's -netdev stream connects to.
	NetSocket string `json:"net_socket"`
	// ControlSocket answers Requests (policy changes, counters).
	ControlSocket string `json:"control_socket"`
	// Log is the file of denied attempts (kept under 1 MiB, plus one old
	// generation as Log.1).
	Log string `json:"log"`
}

// connectTimeout bounds how long the helper waits for QEMU to connect.
const connectTimeout = 2 * time.Minute

// readyFD is the helper's file descriptor on which it reports readiness:
// one JSON readyMsg, then the pipe is closed.
const readyFD = 3

type readyMsg struct {
	Error     string    `json:"error,omitempty"`
	Published []Publish `json:"published,omitempty"`
}

// Main is the helper process: airlock-net CONFIG.json. It binds the
// published ports and its sockets, reports readiness, serves the box's
// network while QEMU is connected, and exits when QEMU's connection ends,
// on SIGTERM, or when QEMU has not connected within 2 minutes.
func Main(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: airlock-net CONFIG.json (started by airlock for each running box)")
		return 2
	}
	ready := os.NewFile(readyFD, "ready")
	report := func(m readyMsg) {
		if ready != nil {
			json.NewEncoder(ready).Encode(m)
			ready.Close()
			ready = nil
		}
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "airlock-net:", err)
		report(readyMsg{Error: err.Error()})
		return 1
	}
	raw, err := os.ReadFile(args[0])
	if err != nil {
		return fail(err)
	}
	var hc HelperConfig
	if err := json.Unmarshal(raw, &hc); err != nil {
		return fail(fmt.Errorf("config %s: %w", args[0], err))
	}
	var logw io.Writer
	if hc.Log != "" {
		lf, err := OpenLog(hc.Log, 1<<20)
		if err != nil {
			return fail(err)
		}
		defer lf.Close()
		logw = lf
	}
	n, err := New(Config{Policy: hc.Policy, Publish: hc.Publish, Upstream: hc.Upstream, Log: logw})
	if err != nil {
		return fail(err)
	}
	defer n.Close()
	os.Remove(hc.NetSocket)
	nl, err := net.Listen("unix", hc.NetSocket)
	if err != nil {
		return fail(err)
	}
	defer nl.Close()
	os.Remove(hc.ControlSocket)
	cl, err := net.Listen("unix", hc.ControlSocket)
	if err != nil {
		return fail(err)
	}
	defer cl.Close()
	go serveControl(cl, n)
	report(readyMsg{Published: n.Published()})

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	conns := make(chan net.Conn, 1)
	go func() {
		nl.(*net.UnixListener).SetDeadline(time.Now().Add(connectTimeout))
		c, err := nl.Accept()
		if err != nil {
			close(conns)
			return
		}
		conns <- c
	}()
	var conn net.Conn
	select {
	case c, ok := <-conns:
		if !ok {
			fmt.Fprintln(os.Stderr, "airlock-net: QEMU did not connect; exiting")
			return 1
		}
		conn = c
	case <-sig:
		return 0
	}
	nl.Close()
	os.Remove(hc.NetSocket)
	go func() {
		<-sig
		n.Close()
	}()
	if err := n.Serve(conn); err != nil {
		fmt.Fprintln(os.Stderr, "airlock-net:", err)
		return 1
	}
	return 0
}

// HelperEnv names the environment variable with the path of the helper
// binary (default: airlock-net beside the executable, else on PATH).
const HelperEnv = "AIRLOCK_NET_HELPER"

// ErrNoHelper means the helper binary was not found.
var ErrNoHelper = errors.New("network helper airlock-net not found: build it (go build -o bin/airlock-net ./cmd/airlock-net, or hack/setup.sh) and put it beside airlock or on PATH, or set " + HelperEnv + ", or use network mode none")

// FindHelper returns the helper binary's path.
func FindHelper() (string, error) {
	if p := os.Getenv(HelperEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", HelperEnv, p, err)
		}
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "airlock-net")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("airlock-net"); err == nil {
		return p, nil
	}
	return "", ErrNoHelper
}

// StartHelper writes hc to configPath and starts the helper bin on it,
// detached (own session, stdin/stdout on /dev/null, stderr to stderrPath),
// and waits until it is ready: it returns its pid and the published ports
// as bound, or its error (a published port in use...).
func StartHelper(ctx context.Context, bin, configPath, stderrPath string, hc HelperConfig) (pid int, published []Publish, err error) {
	raw, _ := json.Marshal(hc)
	if err := os.WriteFile(configPath, raw, 0o600); err != nil {
		return 0, nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer pr.Close()
	errf, err := os.OpenFile(stderrPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		pw.Close()
		return 0, nil, err
	}
	defer errf.Close()
	cmd := exec.Command(bin, configPath)
	cmd.Stderr = errf
	cmd.ExtraFiles = []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return 0, nil, fmt.Errorf("start network helper %s: %w", bin, err)
	}
	pw.Close()
	pid = cmd.Process.Pid
	// Reap it when it exits while this process lives; it outlives us
	// otherwise (re-parented to init).
	go cmd.Wait()
	type result struct {
		m   readyMsg
		err error
	}
	rc := make(chan result, 1)
	go func() {
		var m readyMsg
		err := json.NewDecoder(pr).Decode(&m)
		rc <- result{m, err}
	}()
	var res result
	select {
	case res = <-rc:
	case <-ctx.Done():
		cmd.Process.Kill()
		return 0, nil, ctx.Err()
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		return 0, nil, errors.New("network helper did not become ready in 30 s")
	}
	if res.err != nil {
		cmd.Process.Kill()
		msg, _ := os.ReadFile(stderrPath)
		return 0, nil, fmt.Errorf("network helper failed: %s", strings.TrimSpace(string(msg)))
	}
	if res.m.Error != "" {
		cmd.Process.Kill()
		return 0, nil, errors.New(res.m.Error)
	}
	return pid, res.m.Published, nil
}
