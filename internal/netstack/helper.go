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

	"github.com/airlock-run/airlock/internal/defaults"
)

// HelperConfig is what the helper process (cmd/airlock-net) reads from its
// config file.
type HelperConfig struct {
	Policy  Policy    `json:"policy"`
	Publish []Publish `json:"publish,omitempty"`
	// Upstream: see Config.Upstream.
	Upstream string `json:"upstream,omitempty"`
	// NetSocket is the unix socket QEMU's -netdev stream listens on
	// (server=on); the helper connects to it once QEMU has created it.
	NetSocket string `json:"net_socket"`
	// ControlSocket answers Requests (policy changes, counters).
	ControlSocket string `json:"control_socket"`
	// Log is the file of denied attempts (kept under 1 MiB, plus one old
	// generation as Log.1).
	Log string `json:"log"`
	// UID and GID, when UID is non-zero (airlock runs as root and confines
	// its boxes), are what the helper runs as once it has bound its ports
	// and sockets, opened its log and connected to QEMU: no other box's
	// process runs as them, and it keeps no capability but CAP_NET_RAW,
	// and that only where the host allows GID no unprivileged ICMP
	// sockets (see dropPrivileges).
	UID int `json:"uid,omitempty"`
	GID int `json:"gid,omitempty"`
	// Root, when set, is an empty directory the helper chroots into once
	// set up (before it gives up root): it needs no file by path then, and
	// code that took it over sees none of the host's.
	Root string `json:"root,omitempty"`
	// Secrets says the helper reads a SecretConfig (JSON, at most
	// maxSecretConfig bytes) from its descriptor secretsFD before anything
	// else: the values never pass through a file or its command line.
	Secrets bool `json:"secrets,omitempty"`
}

// secretsFD is the helper's descriptor from which it reads its
// SecretConfig when HelperConfig.Secrets is set.
const secretsFD = 4

// maxSecretConfig bounds a SecretConfig's JSON.
const maxSecretConfig = 2 << 20

// connectTimeout bounds how long the helper waits for QEMU's socket.
const connectTimeout = time.Minute

// readyFD is the helper's file descriptor on which it reports readiness:
// one JSON readyMsg, then the pipe is closed.
const readyFD = 3

type readyMsg struct {
	Error     string    `json:"error,omitempty"`
	Published []Publish `json:"published,omitempty"`
	// Confined says the helper gave up root as HelperConfig.UID asked (an
	// older helper ignores UID and leaves it false).
	Confined bool `json:"confined,omitempty"`
}

// Main is the helper process: airlock-net CONFIG.json. It binds the
// published ports and its control socket, connects to QEMU's network
// socket, reports readiness, serves the box's network while QEMU is
// connected, and exits when QEMU's connection ends, on SIGTERM, or when
// QEMU's socket has not appeared within a minute.
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
	var sc *SecretConfig
	if hc.Secrets {
		f := os.NewFile(secretsFD, "secrets")
		if f == nil {
			return fail(errors.New("secrets: no descriptor 4"))
		}
		raw, err := io.ReadAll(io.LimitReader(f, maxSecretConfig+1))
		f.Close()
		if err != nil || len(raw) > maxSecretConfig {
			return fail(fmt.Errorf("secrets: read: %v (at most %d bytes)", err, maxSecretConfig))
		}
		sc = new(SecretConfig)
		if err := json.Unmarshal(raw, sc); err != nil {
			return fail(fmt.Errorf("secrets: %w", err))
		}
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
	n, err := New(Config{Policy: hc.Policy, Publish: hc.Publish, Upstream: hc.Upstream, Log: logw,
		Secrets: sc, ExtraCA: defaults.ExtraCA()})
	if err != nil {
		return fail(err)
	}
	defer n.Close()
	os.Remove(hc.ControlSocket)
	cl, err := net.Listen("unix", hc.ControlSocket)
	if err != nil {
		return fail(err)
	}
	defer cl.Close()
	// No unlink on close: the seccomp filter denies it (and a chroot hides
	// the path). The next helper removes a stale socket before it listens
	// (above), and removing the box removes its directory.
	cl.(*net.UnixListener).SetUnlinkOnClose(false)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	var conn net.Conn
	for deadline := time.Now().Add(connectTimeout); ; {
		if conn, err = net.Dial("unix", hc.NetSocket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("QEMU's network socket %s: %w", hc.NetSocket, err))
		}
		select {
		case <-sig:
			return 0
		case <-time.After(2 * time.Millisecond):
		}
	}
	// Whether the pings need CAP_NET_RAW: read before the chroot hides
	// /proc.
	pingSysctl, _ := os.ReadFile(pingGroupRange)
	pingRaw := !pingAllowed(string(pingSysctl), hc.GID)
	if hc.Root != "" {
		if err := syscall.Chroot(hc.Root); err != nil {
			return fail(fmt.Errorf("confine the network helper: chroot %s: %w", hc.Root, err))
		}
		if err := syscall.Chdir("/"); err != nil {
			return fail(fmt.Errorf("confine the network helper: %w", err))
		}
	}
	if hc.UID != 0 {
		if err := dropPrivileges(hc.UID, hc.GID, pingRaw); err != nil {
			return fail(fmt.Errorf("confine the network helper: %w", err))
		}
	}
	// Last: the seccomp filter (after the chroot and setuid, which it
	// denies). A confined helper fails without it; an unprivileged one
	// (airlock not root) says so and runs on.
	if err := installSeccomp(); err != nil {
		if hc.UID != 0 {
			return fail(fmt.Errorf("confine the network helper: %w", err))
		}
		fmt.Fprintln(os.Stderr, "airlock-net: running without a seccomp filter:", err)
	}
	go serveControl(cl, n)
	report(readyMsg{Published: n.Published(), Confined: hc.UID != 0})
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
const HelperEnv = defaults.NetHelperEnv

// ErrNoHelper means the helper binary was not found.
var ErrNoHelper = errors.New("network helper airlock-net not found: build it (CGO_ENABLED=0 go build -o bin/airlock-net ./cmd/airlock-net, or hack/setup.sh) and put it beside airlock or on PATH, or set " + HelperEnv + ", or use network mode none")

// FindHelper returns the helper binary's path.
func FindHelper() (string, error) {
	if p := defaults.NetHelper(); p != "" {
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

// Helper is a started helper process.
type Helper struct {
	// Unconfined, after Wait, says why a helper asked to give up root
	// (HelperConfig.UID) did not ("" when it did, or was not asked).
	Unconfined string

	wantUID    bool
	cmd        *exec.Cmd
	stderrPath string
	ready      chan readyResult
}

type readyResult struct {
	m   readyMsg
	err error
}

// Pid returns the helper's process id.
func (h *Helper) Pid() int { return h.cmd.Process.Pid }

// Kill kills the helper.
func (h *Helper) Kill() { h.cmd.Process.Kill() }

// LaunchHelper writes hc to configPath and starts the helper bin on it,
// detached (own session, stdin and stdout on /dev/null, stderr to
// stderrPath). It does not wait: the helper binds its ports, then waits for
// QEMU's socket (hc.NetSocket); Wait says when it is connected. Secrets,
// when set, go to the helper through a pipe (hc.Secrets is set to say
// so): no file and no command line has their values. Listeners, by index
// in hc.Publish, are listening TCP sockets the helper inherits for those
// ports (Publish.FD is set to their descriptor numbers in the helper);
// the caller keeps its own copies.
func LaunchHelper(bin, configPath, stderrPath string, hc HelperConfig, secrets *SecretConfig, listeners map[int]*os.File) (*Helper, error) {
	var secretJSON []byte
	if secrets != nil {
		var err error
		if secretJSON, err = json.Marshal(secrets); err != nil {
			return nil, err
		}
		if len(secretJSON) > maxSecretConfig {
			return nil, fmt.Errorf("secrets: %d bytes of configuration: at most %d", len(secretJSON), maxSecretConfig)
		}
		hc.Secrets = true
	}
	// Inherited after the ready pipe (readyFD) and the secrets pipe
	// (secretsFD), in hc.Publish's order.
	var inherit []*os.File
	next := secretsFD
	if secrets != nil {
		next++
	}
	if len(listeners) > 0 {
		hc.Publish = append([]Publish(nil), hc.Publish...)
		for i := range hc.Publish {
			if f := listeners[i]; f != nil {
				hc.Publish[i].FD = next
				inherit = append(inherit, f)
				next++
			}
		}
	}
	raw, _ := json.Marshal(hc)
	if err := os.WriteFile(configPath, raw, 0o600); err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errf, err := os.OpenFile(stderrPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	defer errf.Close()
	cmd := exec.Command(bin, configPath)
	// The box's gateway, which a guest may take over: none of the caller's
	// secrets, only the variables it reads.
	cmd.Env = helperEnv()
	cmd.Stderr = errf
	cmd.ExtraFiles = []*os.File{pw}
	var sr, sw *os.File
	if secrets != nil {
		if sr, sw, err = os.Pipe(); err != nil {
			pr.Close()
			pw.Close()
			return nil, err
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, sr) // secretsFD
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, inherit...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		if sr != nil {
			sr.Close()
			sw.Close()
		}
		return nil, fmt.Errorf("start network helper %s: %w", bin, err)
	}
	pw.Close()
	if sr != nil {
		sr.Close()
		// The helper reads it first thing; a helper that died before
		// makes the write fail, and Wait reports its error.
		go func() {
			sw.Write(secretJSON)
			sw.Close()
		}()
	}
	// Reap it when it exits while this process lives; it outlives us
	// otherwise (re-parented to init).
	go cmd.Wait()
	h := &Helper{cmd: cmd, stderrPath: stderrPath, ready: make(chan readyResult, 1), wantUID: hc.UID != 0}
	go func() {
		defer pr.Close()
		var m readyMsg
		err := json.NewDecoder(pr).Decode(&m)
		h.ready <- readyResult{m, err}
	}()
	return h, nil
}

// helperEnv is the network helper's environment: defaults.ChildEnv with
// the Go runtime's settings and the variables the helper reads
// (UpstreamEnv, TestInternetEnv, ExtraCAEnv).
func helperEnv() []string {
	return defaults.ChildEnv(append([]string{UpstreamEnv, TestInternetEnv, ExtraCAEnv}, defaults.GoRuntimeEnv...)...)
}

// Wait waits until the helper is connected to QEMU and serving, and
// returns the published ports as bound, or the helper's error (a published
// port in use...), in which case the helper is gone.
func (h *Helper) Wait(ctx context.Context) ([]Publish, error) {
	var res readyResult
	select {
	case res = <-h.ready:
	case <-ctx.Done():
		h.Kill()
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		h.Kill()
		return nil, errors.New("network helper did not become ready in 30 s")
	}
	if res.err != nil {
		h.Kill()
		msg, _ := os.ReadFile(h.stderrPath)
		return nil, fmt.Errorf("network helper failed: %s", strings.TrimSpace(string(msg)))
	}
	if res.m.Error != "" {
		h.Kill()
		return nil, errors.New(res.m.Error)
	}
	if h.wantUID && !res.m.Confined {
		h.Unconfined = fmt.Sprintf("the network helper %s did not give up root (an older build?): rebuild it (hack/setup.sh, or CGO_ENABLED=0 go build ./cmd/airlock-net)", h.cmd.Path)
	}
	return res.m.Published, nil
}
