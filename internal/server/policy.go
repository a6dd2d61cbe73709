package server

import (
	"context"
	"fmt"
	"net/http"

	"github.com/airlock-run/airlock"
)

// Policy is what the operator grants API clients (airlock serve flags).
// Zero fields mean no limit beyond the library's own. A request past a
// limit gets 403 policy_denied with the reason.
type Policy struct {
	// MaxBoxes bounds the boxes of the home that are not stopped
	// (created or running).
	MaxBoxes int
	// MaxCPUs and MaxMemoryMiB bound one box's vCPUs and RAM.
	MaxCPUs      int
	MaxMemoryMiB int
}

func denied(format string, a ...any) *Problem {
	return &Problem{Status: http.StatusForbidden, Title: "Forbidden", Code: CodePolicyDenied, Detail: fmt.Sprintf(format, a...)}
}

// checkCreate applies the policy to a create request.
func (s *Server) checkCreate(ctx context.Context, opts airlock.BoxOptions) error {
	p := s.cfg.Policy
	cpus, mem := opts.CPUs, opts.MemoryMiB
	if cpus == 0 {
		cpus = airlock.DefaultCPUs
	}
	if mem == 0 {
		mem = airlock.DefaultMemoryMiB
	}
	if p.MaxCPUs > 0 && cpus > p.MaxCPUs {
		return denied("%d vCPUs asked; this server allows at most %d per box (airlock serve --max-cpus)", cpus, p.MaxCPUs)
	}
	if p.MaxMemoryMiB > 0 && mem > p.MaxMemoryMiB {
		return denied("%d MiB of memory asked; this server allows at most %d MiB per box (airlock serve --max-memory)", mem, p.MaxMemoryMiB)
	}
	if p.MaxBoxes > 0 {
		infos, err := s.rt.List(ctx)
		if err != nil {
			return problem(err)
		}
		n := 0
		for _, i := range infos {
			if i.State != "stopped" {
				n++
			}
		}
		if n >= p.MaxBoxes {
			return denied("%d boxes are not stopped; this server allows at most %d (airlock serve --max-boxes): remove one first", n, p.MaxBoxes)
		}
	}
	return nil
}
