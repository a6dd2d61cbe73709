package server

import (
	"context"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
)

// secs converts an API duration in seconds, capped at about 290 years
// (what a time.Duration holds): a huge ttl is no ttl overflowing into a
// negative one.
func secs(f float64) time.Duration {
	if f <= 0 || math.IsNaN(f) {
		return 0
	}
	if f >= float64(math.MaxInt64/int64(time.Second)) {
		return math.MaxInt64
	}
	return time.Duration(f * float64(time.Second))
}

// reaped publishes a box the Runtime removed because its ttl, idle
// timeout or lease ended (airlock.Runtime.OnReap): the box's lifetime is
// stored with it and enforced by the library, so a restarted server keeps
// it.
func (s *Server) reaped(ev airlock.BoxReapedEvent) {
	s.dropCodebox(ev.BoxID)
	s.log.Info("box removed", "box", ev.BoxID, "reason", ev.Reason, "error", ev.Err)
}

// reap runs the Runtime's Reap every Config.ReapInterval until ctx ends
// (nothing when it is not set: the Runtime's own reaper runs).
func (s *Server) reap(ctx context.Context) {
	iv := s.cfg.ReapInterval
	if iv <= 0 {
		return
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.rt.Reap(ctx)
	}
}

func (s *Server) registerLease() {
	huma.Register(s.api, huma.Operation{
		OperationID: "renew-lease", Method: http.MethodPost, Path: "/v1/boxes/{id}/lease", Tags: []string{"boxes"},
		Summary: "Renew a box's lease",
		Description: "Extends the lease of a box created with `lease` by that many seconds from now. A box whose lease " +
			"runs out is removed: the SDKs renew it while their process lives, so a crashed client leaves no box behind.",
		DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *boxIDInput) (*struct{}, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		if err := b.RenewLease(ctx); err != nil {
			if errors.Is(err, airlock.ErrNoLease) {
				return nil, &Problem{Status: http.StatusConflict, Title: "Conflict", Code: CodeNoLease,
					Detail: "box " + b.ID() + " has no lease (create it with \"lease\": SECONDS)"}
			}
			return nil, problem(err)
		}
		return nil, nil
	})
}
