package server

import (
	"context"
	"net/http"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/danielgtaylor/huma/v2"
)

// BoxStats is what a running box takes from the host now (airlock.BoxStats,
// what `airlock stats` shows for one box).
type BoxStats struct {
	ID               string        `json:"id" doc:"Box id."`
	Name             string        `json:"name,omitempty" doc:"Box name."`
	Read             time.Time     `json:"read" doc:"When the second reading was taken (RFC 3339)."`
	CPUPercent       float64       `json:"cpu_percent" doc:"Percent of one host CPU the box's VM used over the sample (100: one core busy; more with several vCPUs); about 0 while the box is paused."`
	CPUSeconds       float64       `json:"cpu_seconds" doc:"Host CPU time (user + system) the box's VM process has used since it started, seconds."`
	SampleMs         float64       `json:"sample_ms" doc:"How long the sample behind cpu_percent lasted, ms (about 500)."`
	MemoryBytes      int64         `json:"memory_bytes" doc:"The VM process's resident memory, bytes: the guest memory it touched and QEMU's own."`
	MemoryLimitBytes int64         `json:"memory_limit_bytes" doc:"The box's guest memory (memory_mib), bytes."`
	DiskBytes        int64         `json:"disk_bytes" doc:"What the box's writable layer takes on the host's disk (allocated blocks), bytes."`
	Network          *NetworkStats `json:"network,omitempty" doc:"The box network's counters since the box started; absent for network none."`
	Paused           bool          `json:"paused,omitempty" doc:"The box is paused in memory (POST /v1/boxes/{id}/pause): its figures are read on the host, so they are served; its CPU stands still."`
}

// NetworkStats are a box network's counters (airlock.NetworkStats).
type NetworkStats struct {
	BytesOut    uint64 `json:"bytes_out" doc:"Bytes the box sent out through its network, bytes."`
	BytesIn     uint64 `json:"bytes_in" doc:"Bytes the box received through its network, bytes."`
	Connections uint64 `json:"connections" doc:"TCP connections and UDP flows opened."`
	Denied      uint64 `json:"denied" doc:"Connections, UDP flows, pings and DNS queries the network policy refused."`
	DNSQueries  uint64 `json:"dns_queries" doc:"DNS queries the box's resolver answered."`
}

// statsSample is how long GET /v1/boxes/{id}/stats samples a box's CPU
// (as `airlock stats --no-stream`).
const statsSample = 500 * time.Millisecond

func (s *Server) registerStats() {
	huma.Register(s.api, huma.Operation{
		OperationID: "box-stats", Method: http.MethodGet, Path: "/v1/boxes/{id}/stats", Tags: []string{"boxes"},
		Summary: "A running box's CPU, memory, disk and network use",
		Description: "What `airlock stats` shows for one box (docker's container stats, BoxLite's box.metrics()): its VM's CPU " +
			"over a sample of about 0.5 s (the call takes that long), its resident memory against its guest memory, its " +
			"writable layer's disk use and its network counters. Read on the host, so a box paused in memory answers too " +
			"(paused: true, CPU about 0). A stopped box, or one paused to disk, is 409 box_not_running. The guest's process " +
			"count is not reported (it would need the guest's agent).",
		Errors: []int{http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *boxIDInput) (*struct{ Body BoxStats }, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		first, err := b.Stats(ctx)
		if err != nil {
			return nil, problem(err)
		}
		select {
		case <-ctx.Done():
			return nil, problem(ctx.Err())
		case <-time.After(statsSample):
		}
		st, err := b.Stats(ctx)
		if err != nil {
			return nil, problem(err)
		}
		out := &struct{ Body BoxStats }{Body: statsOf(b, first, st)}
		return out, nil
	})
}

// statsOf is the REST view of box b's readings first and then st.
func statsOf(b *airlock.Box, first, st airlock.BoxStats) BoxStats {
	v := BoxStats{ID: b.ID(), Name: b.Name(), Read: st.At.UTC(), CPUPercent: st.CPUPercent(first),
		CPUSeconds: st.CPU.Seconds(), SampleMs: float64(st.At.Sub(first.At).Microseconds()) / 1000,
		MemoryBytes: st.MemoryBytes, MemoryLimitBytes: st.MemoryLimitBytes, DiskBytes: st.DiskBytes, Paused: st.Paused}
	if n := st.Network; n != nil {
		v.Network = &NetworkStats{BytesOut: n.BytesOut, BytesIn: n.BytesIn, Connections: n.Connections, Denied: n.Denied, DNSQueries: n.DNSQueries}
	}
	return v
}
