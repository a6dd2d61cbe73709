package airlock

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/measure"
	"github.com/airlock-run/airlock/internal/sparse"
)

// BoxStats is one reading of what a running box takes from the host
// (Box.Stats): what `airlock stats` and GET /v1/boxes/{id}/stats show.
// Everything is read on the host, so a box paused in memory has figures
// too (its CPU stands still).
type BoxStats struct {
	// At is when the reading was taken.
	At time.Time
	// CPU is the host CPU time (user + system) the box's VM process has
	// used since it started; CPUPercent turns two readings into a rate.
	CPU time.Duration
	// MemoryBytes is the VM process's resident memory (the guest memory
	// it touched, and QEMU's own); MemoryLimitBytes the box's guest
	// memory (BoxOptions.MemoryMiB).
	MemoryBytes, MemoryLimitBytes int64
	// DiskBytes is what the box's writable layer takes on the host's disk
	// (allocated blocks, as BoxInfo.DiskBytes).
	DiskBytes int64
	// Network is the box network's counters (NetworkStats); nil for a box
	// with network mode none, or when its network helper did not answer.
	Network *NetworkStats
	// Paused says the box is paused in memory (Pause).
	Paused bool
}

// CPUPercent is the percent of one host CPU the box's VM used between
// reading prev and s (100: one core busy all the time; more with several
// vCPUs); 0 when prev is not an earlier reading.
func (s BoxStats) CPUPercent(prev BoxStats) float64 {
	d := s.At.Sub(prev.At)
	if d <= 0 || prev.At.IsZero() || s.CPU < prev.CPU {
		return 0
	}
	return float64(s.CPU-prev.CPU) / float64(d) * 100
}

// statsNetTimeout bounds Stats' question to the box's network helper.
const statsNetTimeout = 2 * time.Second

// Stats reads what the running box takes from the host now: its VM's CPU
// time and resident memory (from /proc), its guest memory, its writable
// layer's disk use and its network's counters. It does not use the guest
// agent, so it answers for a paused box too. Errors: ErrBoxNotRunning
// (a box paused to disk says so), or the VM process gone meanwhile.
func (b *Box) Stats(ctx context.Context) (BoxStats, error) {
	rec, err := b.load(ctx)
	if err != nil {
		return BoxStats{}, err
	}
	if !running(rec) {
		return BoxStats{}, b.notRunningErr()
	}
	_, cfg := b.snapshot()
	st := BoxStats{At: time.Now(), MemoryLimitBytes: int64(cfg.Options.MemoryMiB) << 20,
		DiskBytes: sparse.Allocated(filepath.Join(b.r.opts.Home, "boxes", rec.ID, boxdir.RW))}
	cpu, rss, err := measure.ProcUsage(rec.PID)
	if err != nil {
		return BoxStats{}, fmt.Errorf("stats of box %s: %w", b.id, err)
	}
	st.CPU, st.MemoryBytes = cpu, rss
	st.Paused = b.pausedNow(ctx, rec)
	if netMode(cfg.Options.Network, cfg.Options.AllowNet) != NetworkNone {
		nctx, cancel := context.WithTimeout(ctx, statsNetTimeout)
		if ns, err := b.NetworkStats(nctx); err == nil {
			st.Network = &ns
		}
		cancel()
	}
	return st, nil
}
