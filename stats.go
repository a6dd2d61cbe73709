package airlock

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
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
	cpu, rss, err := procUsage(rec.PID)
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

// procUsage reads process pid's CPU time (utime + stime of
// /proc/PID/stat, in clock ticks of 10 ms: Linux's USER_HZ) and resident
// memory (VmRSS of /proc/PID/status).
func procUsage(pid int) (cpu time.Duration, rss int64, err error) {
	if pid <= 0 {
		return 0, 0, fmt.Errorf("no VM process")
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("its VM process %d: %w", pid, err)
	}
	str := string(raw)
	i := strings.LastIndexByte(str, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("its VM process %d: /proc/%d/stat unreadable", pid, pid)
	}
	f := strings.Fields(str[i+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("its VM process %d: /proc/%d/stat unreadable", pid, pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	cpu = time.Duration(ut+stime) * 10 * time.Millisecond
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			rss = kb << 10
		}
	}
	return cpu, rss, nil
}
