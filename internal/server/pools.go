package server

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
)

// Pool is the state of one warm pool of the server (airlock serve --pool).
type Pool struct {
	Image    string   `json:"image"`
	Key      string   `json:"key" doc:"Identifies the pool's box options (a hash)."`
	Size     int      `json:"size" doc:"Boxes the pool keeps ready (its target)."`
	Ready    int      `json:"ready" doc:"Boxes ready to be taken by a create with the pool's options."`
	Filling  int      `json:"filling" doc:"Boxes being restored or booted."`
	Boxes    []string `json:"boxes" doc:"Ids of the ready boxes, oldest first (GET /v1/boxes does not list them)."`
	Template string   `json:"template,omitempty" doc:"The template snapshot the pool's boxes are restored from."`
	Booted   bool     `json:"booted,omitempty" doc:"The VM driver cannot snapshot: pool boxes are booted."`
	Claimed  int      `json:"claimed" doc:"Boxes taken from the pool since the server started."`
	Evicted  int      `json:"evicted" doc:"Ready boxes removed to make room for a box started past a cap."`
	HeldBack string   `json:"held_back,omitempty" doc:"Why the pool is below its size without failing: a host cap, or --max-boxes, is reached."`
	Error    string   `json:"error,omitempty" doc:"The last failure to fill the pool (retried with a backoff)."`
}

// PoolList is the body of GET /v1/pools.
type PoolList struct {
	Pools []Pool `json:"pools"`
}

func (s *Server) registerPools() {
	huma.Register(s.api, huma.Operation{
		OperationID: "list-pools", Method: http.MethodGet, Path: "/v1/pools", Tags: []string{"server"},
		Summary:     "List the warm pools",
		Description: "The server's warm pools (airlock serve --pool; docs/pool.md): their boxes, which the box list does not show, and why a pool is not full. Empty without --pool.",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body PoolList }, error) {
		out := &struct{ Body PoolList }{}
		out.Body.Pools = []Pool{}
		if s.rt == nil {
			return out, nil
		}
		for _, p := range s.rt.Pools() {
			out.Body.Pools = append(out.Body.Pools, poolOf(p))
		}
		return out, nil
	})
}

func poolOf(p airlock.PoolInfo) Pool {
	boxes := p.Boxes
	if boxes == nil {
		boxes = []string{}
	}
	return Pool{Image: p.Image, Key: p.Key, Size: p.Size, Ready: p.Ready, Filling: p.Filling, Boxes: boxes,
		Template: p.Template, Booted: p.Booted, Claimed: p.Claimed, Evicted: p.Evicted, HeldBack: p.HeldBack, Error: p.LastError}
}
