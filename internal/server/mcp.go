package server

import (
	"context"
	"fmt"

	"github.com/airlock-run/airlock"
)

// CheckBox applies the server's policy to a box another front end of the
// server makes on a client's behalf (the MCP endpoint's session boxes),
// as to a REST create: the grants, the per-box caps and --max-boxes, and
// for a tenant's session (ctx carries the tenant) its quotas, the box
// made the tenant's (opts gets TenantLabel). A
// refusal is a *Problem whose Detail says why and which flag grants it.
// Call release once the box is made (or its making failed): until then
// the named volumes it makes count against the volume caps.
func (s *Server) CheckBox(ctx context.Context, opts *airlock.BoxOptions) (release func(), err error) {
	if err := own(ctx, opts); err != nil {
		return nil, err
	}
	return s.checkCreate(ctx, opts)
}

// MCPClient is the client whose exec slots (Config.MaxExecsPerClient) the
// MCP endpoint's tool calls take, all sessions together.
const MCPClient = "mcp"

// E2BClient is the client whose exec slots the E2B API's processes and
// code runs take (airlock serve --e2b), all sandboxes together.
const E2BClient = "e2b"

// AcquireExec takes one of client's exec slots (Config.MaxExecsPerClient)
// for a run that does not come through a REST handler; release gives it
// back. With none free it is a *Problem (429 too_many_execs).
func (s *Server) AcquireExec(ctx context.Context, client string) (release func(), err error) {
	return s.acquire(context.WithValue(ctx, clientKey, client))
}

// PullContext returns ctx under which the image pulls that another front
// end's creates cause (airlock serve --e2b) obey the server's network
// grants, as a REST create's do: loopback and private registries need
// --allow-private-net, link-local ones are refused.
func (s *Server) PullContext(ctx context.Context) context.Context { return s.pullContext(ctx) }

// CheckNetwork applies the server's network grants to another front
// end's change of a box's network (airlock serve --e2b's update_network)
// as to a REST create's allow_net: IPs and CIDRs inside private ranges
// need --allow-private-net. A refusal is a *Problem.
func (s *Server) CheckNetwork(ctx context.Context, allow []string) error {
	p, _ := s.policyFor(ctx)
	return checkAllowNet(p, allow)
}

// CheckStart applies the policy to another front end's start or resume
// of box b (airlock serve --e2b's connect), as POST /v1/boxes/{id}/start
// and /resume do: --max-boxes and --min-free-disk. A refusal is a *Problem.
func (s *Server) CheckStart(ctx context.Context, b *airlock.Box) error {
	release, err := s.checkStart(ctx, b)
	if err == nil {
		release() // the E2B API's requests are the admin's: no quota
	}
	return err
}

// CheckSuspend applies the policy to another front end's pause to disk of
// box b, as POST /v1/boxes/{id}/pause with to_disk does: its memory counts
// against --min-free-disk. A refusal is a *Problem.
func (s *Server) CheckSuspend(ctx context.Context, b *airlock.Box) error {
	info, err := b.Info(ctx)
	if err != nil {
		return problem(err)
	}
	mem := int64(info.Options.MemoryMiB)
	return s.checkFreeDisk(ctx, fmt.Sprintf("pausing to disk a box with %d MiB of memory", mem), mem)
}

// CheckCheckpoint applies the policy to another front end's checkpoint of
// box b (the MCP endpoint's checkpoint tool), as POST
// /v1/boxes/{id}/checkpoints does: its memory and disk count against
// --min-free-disk. A refusal is a *Problem.
func (s *Server) CheckCheckpoint(ctx context.Context, b *airlock.Box) error {
	info, err := b.Info(ctx)
	if err != nil {
		return problem(err)
	}
	return s.checkCheckpointDisk(ctx, info)
}

// CheckSnapshot applies the policy to another front end's snapshot of
// box b (airlock serve --e2b's create_snapshot), as POST
// /v1/boxes/{id}/snapshots does: --max-snapshots and --min-free-disk.
// Call release once the snapshot is taken (or failed). A refusal is a
// *Problem.
func (s *Server) CheckSnapshot(ctx context.Context, b *airlock.Box) (release func(), err error) {
	info, err := b.Info(ctx)
	if err != nil {
		return nil, problem(err)
	}
	return s.reserveSnapshot(ctx, info)
}

// CheckFork applies the policy to another front end's fork of box b into
// n boxes (airlock serve --e2b's fork), as POST /v1/boxes/{id}/fork does:
// --max-boxes and --min-free-disk. A refusal is a *Problem.
func (s *Server) CheckFork(ctx context.Context, b *airlock.Box, n int) error {
	info, err := b.Info(ctx)
	if err != nil {
		return problem(err)
	}
	return s.checkFork(ctx, info, n)
}
