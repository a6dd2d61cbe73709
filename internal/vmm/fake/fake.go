// Package fake is a FAKE VM driver for tests: instead of booting a VM it
// runs the real guest agent (cmd/airlock-agent) as a host process, in host
// mode (AIRLOCK_AGENT_LISTEN), serving the agent protocol on a unix socket
// in the box directory. Host mode mounts nothing, makes no cgroups and
// touches no /etc; commands run in the host's root filesystem as the host
// user would run them. Where it may (root), the agent starts as PID 1 of
// a new PID namespace, so that its end — a crash or a kill — ends every
// process it started, as a VM's end does.
//
// A box's writable layer is a host directory of its own (FilesDir) that
// its commands may write to; otherwise they see the host's files.
// Driver has no snapshots and cannot pause; Snapshotting (snapshot.go) is
// the fake with both, modelled on the QEMU driver's contract.
//
// What it does not fake: disks (a box's files are the host's), network
// traffic, hostnames, guest kernels, a snapshot's processes. A Spec with Net gets a NIC with no
// guest behind it: the agent process holds a listening socket at
// Net.Socket, so that the network stack connects and ends with the machine
// as it does with QEMU, but no frame ever crosses it; where it may (root)
// the agent runs in a network namespace of its own, without any network. It is for testing the lifecycle code in
// package airlock (create, start, stop, remove, reconnect, a machine dying
// under a pending exec, reconciling records after a crash) in milliseconds.
package fake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Driver is the fake driver. Agent is the guest agent binary it runs.
type Driver struct {
	Agent string
	// TestWedgeExec is a TEST-ONLY fault: the agent never reports the end
	// of an exec, for tests of the host's own exec timer. It needs a build
	// with the airlock_testfaults tag, of the agent too (vmtest.Main builds
	// it so in such builds); without it, Start fails saying so.
	TestWedgeExec bool
	// Scope is TEST-ONLY: when set, this driver's machines carry it and
	// its Usage counts only the machines of drivers with the same Scope,
	// so that a test of the host caps is not thrown by other tests' fake
	// machines on the host. Empty: Usage counts every fake machine.
	Scope string
	// TestAgent is TEST-ONLY: when set, DialAgent asks it for the host's
	// connection instead of dialing the agent's socket, giving it the box
	// id and a dial of the real agent (whose process still stands for the
	// machine), so that a test can play the guest agent behind the whole
	// host stack or stand between host and agent (internal/agent/evilagent).
	TestAgent func(ctx context.Context, boxID string, real func(context.Context) (net.Conn, error)) (net.Conn, error)
}

var _ vmm.Driver = (*Driver)(nil)
var _ vmm.UsageReporter = (*Driver)(nil)

// argv0Prefix starts the argv[0] of a fake machine's agent process:
// argv0Prefix + box id + ":" + memory MiB of its spec [+ ":" + Scope].
const argv0Prefix = "airlock-fake-agent:"

// Usage counts the fake machines running on this host (agent processes
// named argv0Prefix..., of every home; only those of d.Scope when it is
// set) other than box except's, and the memory their specs asked for.
func (d *Driver) Usage(except string) vmm.Usage {
	var u vmm.Usage
	// A machine counts once: a child the agent forks has its argv[0]
	// until it execs.
	seen := map[string]bool{}
	ents, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range ents {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		arg0, _, _ := strings.Cut(string(b), "\x00")
		rest, ok := strings.CutPrefix(arg0, argv0Prefix)
		if !ok {
			continue
		}
		id, mem, _ := strings.Cut(rest, ":")
		mem, scope, _ := strings.Cut(mem, ":")
		if id == except || d.Scope != "" && scope != d.Scope || seen[id] {
			continue
		}
		seen[id] = true
		n, _ := strconv.Atoi(mem)
		u.Machines++
		u.MemoryMiB += n
	}
	return u
}

// New returns a fake driver running the agent binary at agent.
func New(agent string) *Driver { return &Driver{Agent: agent} }

// Name returns "fake".
func (d *Driver) Name() string { return "fake" }

// Create makes the box's writable layer: an empty host directory,
// FilesDir(spec.Dir) (the fake has no disks; its commands run in the
// host's root filesystem and may keep files there).
func (d *Driver) Create(ctx context.Context, spec vmm.Spec) error {
	if _, err := os.Stat(d.Agent); err != nil {
		return fmt.Errorf("fake driver: agent binary: %w", err)
	}
	if err := os.Mkdir(FilesDir(spec.Dir), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("fake driver: writable layer: %w", err)
	}
	return nil
}

// nicSocket listens on spec.Net.Socket, for the agent process to hold
// (nil without a NIC).
func nicSocket(spec vmm.Spec) (*os.File, error) {
	if spec.Net == nil {
		return nil, nil
	}
	if spec.Net.Socket == "" {
		return nil, fmt.Errorf("fake driver: the driver's own user-mode network: %w", vmm.ErrNotSupported)
	}
	os.Remove(spec.Net.Socket)
	l, err := net.Listen("unix", spec.Net.Socket)
	if err != nil {
		return nil, fmt.Errorf("fake driver: network socket: %w", err)
	}
	defer l.Close()
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	return l.(*net.UnixListener).File()
}

// Start runs the agent, detached (its own session), with its output in the
// box's console log.
func (d *Driver) Start(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if len(spec.Volumes) > 0 {
		return nil, fmt.Errorf("volumes: %w", vmm.ErrNotSupported)
	}
	if err := boxdir.PrepareSockDir(spec.Dir, spec.ID, boxdir.FakeAgent); err != nil {
		return nil, err
	}
	sock := boxdir.SockPath(spec.Dir, spec.ID, boxdir.FakeAgent)
	os.Remove(sock)
	console, err := os.OpenFile(filepath.Join(spec.Dir, boxdir.Console), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer console.Close()
	nic, err := nicSocket(spec)
	if err != nil {
		return nil, err
	}
	if nic != nil {
		defer nic.Close()
	}
	start := func(flags uintptr) (*exec.Cmd, error) {
		cmd := exec.Command(d.Agent)
		// Its name in ps says which box it is and the memory the box
		// asked for, so that Usage can count fake machines host-wide.
		arg0 := argv0Prefix + spec.ID + ":" + strconv.Itoa(spec.MemoryMiB)
		if d.Scope != "" {
			arg0 += ":" + d.Scope
		}
		cmd.Args = []string{arg0}
		cmd.Env = append(os.Environ(), guestabi.HostListenEnv+"=unix:"+sock)
		if d.TestWedgeExec {
			env, err := wedgeEnv()
			if err != nil {
				return nil, err
			}
			cmd.Env = append(cmd.Env, env)
		}
		cmd.Stdout, cmd.Stderr = console, console
		if nic != nil {
			cmd.ExtraFiles = []*os.File{nic}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: flags}
		return cmd, cmd.Start()
	}
	cmd, err := start(unix.CLONE_NEWPID | unix.CLONE_NEWNET)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) {
		cmd, err = start(0) // not root: processes may outlive the agent
	}
	if err != nil {
		return nil, fmt.Errorf("fake driver: start agent: %w", err)
	}
	pid := cmd.Process.Pid
	go cmd.Wait() // reap it when it ends (a zombie would look alive to a pidfd)
	h := vmm.Handle{PID: pid, Start: vmm.StartTime(pid)}
	if h.Start == 0 {
		return nil, fmt.Errorf("fake driver: agent exited at once; console:\n%s", vmm.ConsoleTail(console.Name(), 10))
	}
	return d.Attach(spec, h), nil
}

// Attach returns the machine h of spec's box.
func (d *Driver) Attach(spec vmm.Spec, h vmm.Handle) vmm.Machine {
	return &machine{dir: spec.Dir, id: spec.ID, sock: boxdir.SockPath(spec.Dir, spec.ID, boxdir.FakeAgent), h: h, testAgent: d.TestAgent}
}

type machine struct {
	dir, id, sock string
	h             vmm.Handle
	testAgent     func(ctx context.Context, boxID string, real func(context.Context) (net.Conn, error)) (net.Conn, error)

	once sync.Once
	exit <-chan struct{}
}

func (m *machine) Handle() vmm.Handle { return m.h }
func (m *machine) Alive() bool        { return m.h.Alive() }

func (m *machine) Exited() <-chan struct{} {
	m.once.Do(func() { m.exit = vmm.Watch(m.h) })
	return m.exit
}

func (m *machine) Death() vmm.Death {
	return vmm.DeathFromConsole(filepath.Join(m.dir, boxdir.Console),
		fmt.Sprintf("its agent process (pid %d, fake driver) exited unexpectedly", m.h.PID))
}

func (m *machine) Console(n int) string {
	return vmm.ConsoleTail(filepath.Join(m.dir, boxdir.Console), n)
}

// Quit sends the agent SIGTERM, and SIGCONT for a paused one (as QEMU
// quits when paused).
func (m *machine) Quit(ctx context.Context) error {
	if !m.h.Alive() {
		return nil
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGCONT} {
		// ESRCH: it ended meanwhile (on SIGTERM, fast).
		if err := unix.Kill(m.h.PID, sig); err != nil && !errors.Is(err, unix.ESRCH) {
			return err
		}
	}
	return nil
}

// Kill ends the agent (SIGKILL) and continues the processes it started if
// it was paused: where they outlive the agent (not root) none is left
// stopped for good.
func (m *machine) Kill() error {
	var kids []int
	if p, _ := paused(m.h); p {
		kids = descendants(m.h.PID)
	}
	err := vmm.Kill(m.h)
	for _, k := range kids {
		unix.Kill(k, unix.SIGCONT)
	}
	return err
}

// Release does nothing: the fake holds nothing outside its process.
func (m *machine) Release() {}

// DialAgent connects to the agent's socket, waiting (within ctx) for the
// agent to create it.
func (m *machine) DialAgent(ctx context.Context) (*client.Client, error) {
	if m.testAgent != nil {
		return client.Dial(ctx, func(ctx context.Context) (net.Conn, error) {
			return m.testAgent(ctx, m.id, m.dialSocket)
		})
	}
	return client.Dial(ctx, m.dialSocket)
}

// dialSocket connects to the agent's socket, waiting (within ctx) for the
// agent to create it.
func (m *machine) dialSocket(ctx context.Context) (net.Conn, error) {
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", m.sock)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ECONNREFUSED) {
			return nil, err
		}
		if !m.h.Alive() {
			return nil, fmt.Errorf("agent process %d is gone", m.h.PID)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
