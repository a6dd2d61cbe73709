//go:build linux

// Package agent is the guest side of airlock: the service that the
// guest agent (cmd/airlock-agent) serves to the host. It runs commands in
// the box's root filesystem, streams their output with backpressure, kills
// whole process trees on timeout, and shuts the box down cleanly.
package agent

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/transport"
)

// Version is the agent's protocol and build version, reported in the
// handshake and by Hello (agentpb.Version).
const Version = agentpb.Version

// Config says where the agent runs processes.
type Config struct {
	// Root is the box's root filesystem as seen by the agent; processes
	// are chrooted into it. "" or "/" runs them in the agent's own root.
	Root string
	// CgroupRoot is a cgroup v2 directory under which each exec gets its
	// own cgroup, so that a timeout kills every process it started, even
	// ones that left its process group. "" falls back to process groups.
	CgroupRoot string
	// ReapAll makes the agent reap every child of the process (PID 1).
	ReapAll bool
	// Shutdown is called after a Shutdown call has been answered. It is
	// expected to stop all processes, sync, unmount and power off.
	Shutdown func()
	// ExecPids is each exec's pids.max (processes and threads) when
	// CgroupRoot is set: 0 means DefaultExecPids, negative means none.
	// Each exec's memory.max is the guest's memory less a reserve for the
	// agent (see limits.go).
	ExecPids int
	// SetHostname, when set, gives the box a new hostname (Restored).
	SetHostname func(name string)
	// OnHost says the agent runs as a host process (host mode: the fake
	// VM driver, tests), not as a guest's PID 1: the kernel RNG and the
	// clock are the host's, and Restored leaves them alone (as root it
	// would step the host's clock).
	OnHost bool
}

// Server implements the Agent service of agentpb/agent.proto.
type Server struct {
	cfg        Config
	reaper     *Reaper
	execMemMax int64 // each exec's memory.max, 0 for none

	// spareCgroup is an exec cgroup made (with its limits) after the last
	// exec ended, for the next one to start in without waiting for
	// cgroupfs; a snapshot holds it too, so the first exec of a restored
	// box does not make one either. "" when none; guarded by cgMu.
	cgMu        sync.Mutex
	spareCgroup string

	fr freezer // Freeze
}

// NewServer returns an agent service for cfg. With a CgroupRoot it enables
// the memory and pids controllers there and, as PID 1, moves itself into a
// cgroup of its own.
func NewServer(cfg Config) *Server {
	s := &Server{cfg: cfg, reaper: NewReaper(cfg.ReapAll)}
	s.setupCgroups()
	return s
}

// Handle serves one call of the agent protocol; it is the
// transport.Handler that transport.Serve runs for each stream.
func (s *Server) Handle(method string, st *transport.Stream) error {
	switch method {
	case agentpb.MethodHello:
		if err := st.Recv(new(agentpb.HelloRequest)); err != nil {
			return err
		}
		return st.Send(s.Hello())
	case agentpb.MethodShutdown:
		if err := st.Recv(new(agentpb.ShutdownRequest)); err != nil {
			return err
		}
		return st.Send(s.Shutdown())
	case agentpb.MethodExec:
		return s.Exec(protoStream{st})
	case agentpb.MethodRestored:
		req := new(agentpb.RestoredRequest)
		if err := st.Recv(req); err != nil {
			return err
		}
		resp, err := s.Restored(req)
		if err != nil {
			return err
		}
		return st.Send(resp)
	case agentpb.MethodFreeze:
		req := new(agentpb.FreezeRequest)
		if err := st.Recv(req); err != nil {
			return err
		}
		resp, err := s.Freeze(req)
		if err != nil {
			return err
		}
		return st.Send(resp)
	}
	if ok, err := s.handleFile(method, st); ok {
		return err
	}
	return fmt.Errorf("unknown call %q (the host speaks a newer protocol than agent %s)", method, Version)
}

// Hello reports the agent's version, the guest kernel and its uptime.
func (s *Server) Hello() *agentpb.HelloResponse {
	var uts unix.Utsname
	unix.Uname(&uts)
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return &agentpb.HelloResponse{
		Version:  Version,
		Kernel:   strings.TrimRight(string(uts.Release[:]), "\x00"),
		UptimeNs: ts.Nano(),
	}
}

// Shutdown starts stopping the box (Config.Shutdown) shortly after the reply
// has been sent.
func (s *Server) Shutdown() *agentpb.ShutdownResponse {
	if s.cfg.Shutdown != nil {
		go func() {
			// Let the reply reach the host first.
			time.Sleep(50 * time.Millisecond)
			s.cfg.Shutdown()
		}()
	}
	return &agentpb.ShutdownResponse{}
}

// execStream is an Exec call's stream of typed messages: a protocol
// stream (protoStream) or, for Prewarm, a local one.
type execStream interface {
	Send(*agentpb.ExecEvent) error
	Recv() (*agentpb.ExecRequest, error)
	Context() context.Context
}

// protoStream is an Exec call's transport stream.
type protoStream struct{ st *transport.Stream }

func (e protoStream) Send(ev *agentpb.ExecEvent) error { return e.st.Send(ev) }

func (e protoStream) Recv() (*agentpb.ExecRequest, error) {
	m := new(agentpb.ExecRequest)
	if err := e.st.Recv(m); err != nil {
		return nil, err
	}
	return m, nil
}

func (e protoStream) Context() context.Context { return e.st.Context() }

// localStream runs one exec inside the agent: it hands Exec the start
// message, then no more requests until the exit status has been sent.
type localStream struct {
	start *agentpb.ExecStart
	sent  bool
	exit  chan struct{}
}

func (l *localStream) Send(ev *agentpb.ExecEvent) error {
	if ev.GetExit() != nil {
		close(l.exit)
	}
	return nil
}

func (l *localStream) Recv() (*agentpb.ExecRequest, error) {
	if !l.sent {
		l.sent = true
		return &agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Start{Start: l.start}}, nil
	}
	<-l.exit
	return nil, io.EOF
}

func (l *localStream) Context() context.Context { return context.Background() }

// Prewarm runs /bin/true in the box the way an Exec call would, output
// discarded, while the agent waits for the host: under TCG, code runs slowly
// the first time (QEMU translates it), and this way the agent's exec path,
// the dynamic loader and libc are translated before the first real exec.
// Best effort and silent (an image without /bin/true is fine).
func (s *Server) Prewarm() {
	s.Exec(&localStream{
		start: &agentpb.ExecStart{Argv: []string{"/bin/true"}, Env: []string{"PATH=/usr/bin:/bin"}},
		exit:  make(chan struct{}),
	})
}
