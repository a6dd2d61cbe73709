//go:build linux

// Package agent is the guest side of airlock: the gRPC service that the
// guest agent (cmd/airlock-agent) serves to the host. It runs commands in
// the box's root filesystem, streams their output with backpressure, kills
// whole process trees on timeout, and shuts the box down cleanly.
package agent

import (
	"context"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/transport"
)

// Version is the agent's protocol and build version, reported in the
// handshake and by Hello.
const Version = "0.1.0"

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
}

// Server implements agentpb.AgentServer.
type Server struct {
	agentpb.UnimplementedAgentServer
	cfg    Config
	reaper *Reaper
}

// NewServer returns an agent service for cfg.
func NewServer(cfg Config) *Server {
	return &Server{cfg: cfg, reaper: NewReaper(cfg.ReapAll)}
}

// GRPCServer returns a gRPC server with the agent service registered and the
// transport's window sizes.
func (s *Server) GRPCServer() *grpc.Server {
	g := grpc.NewServer(transport.ServerOptions()...)
	agentpb.RegisterAgentServer(g, s)
	return g
}

// Hello implements agentpb.AgentServer.
func (s *Server) Hello(ctx context.Context, _ *agentpb.HelloRequest) (*agentpb.HelloResponse, error) {
	var uts unix.Utsname
	unix.Uname(&uts)
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return &agentpb.HelloResponse{
		Version:  Version,
		Kernel:   strings.TrimRight(string(uts.Release[:]), "\x00"),
		UptimeNs: ts.Nano(),
	}, nil
}

// Shutdown implements agentpb.AgentServer.
func (s *Server) Shutdown(ctx context.Context, _ *agentpb.ShutdownRequest) (*agentpb.ShutdownResponse, error) {
	if s.cfg.Shutdown != nil {
		go func() {
			// Let the reply reach the host first.
			time.Sleep(50 * time.Millisecond)
			s.cfg.Shutdown()
		}()
	}
	return &agentpb.ShutdownResponse{}, nil
}
