package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
)

// metricsScript prints, from inside the box, its CPU times twice a quarter
// second apart (the busy share between them is cpuUsedPct), its memory,
// and the use of its root filesystem: the sandbox's own view, as envd
// reports it.
const metricsScript = `head -n 1 /proc/stat; sleep 0.25; cat /proc/stat /proc/meminfo; df -P -k / | tail -n 1`

// sandboxMetric is E2B's SandboxMetric (sizes in bytes).
type sandboxMetric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// metrics answers GET /sandboxes/{id}/metrics with one sample taken now
// (airlock keeps no history: start and end are not used); none for a
// sandbox that is not running.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	b, info, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		writeBoxError(w, err)
		return
	}
	if info.State != airlock.BoxRunning {
		writeJSON(w, http.StatusOK, []sandboxMetric{})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	res, err := b.Exec(ctx, "sh", []string{"-c", metricsScript}, airlock.ExecOptions{User: "root", WorkingDir: "/", Timeout: 20 * time.Second, MaxOutput: 256 << 10})
	if err != nil {
		writeBoxError(w, err)
		return
	}
	m, err := parseMetrics(string(res.Stdout), time.Now())
	if err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("the sandbox's metrics: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, []sandboxMetric{m})
}

// cpuTimes returns the busy and total jiffies of a /proc/stat cpu line.
func cpuTimes(line string) (busy, total uint64, ok bool) {
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if i >= 8 {
			break // guest and guest_nice are counted in user and nice
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, true
}

// parseMetrics reads metricsScript's output.
func parseMetrics(out string, now time.Time) (sandboxMetric, error) {
	m := sandboxMetric{Timestamp: now.UTC().Format(time.RFC3339), TimestampUnix: now.Unix()}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 {
		return m, errors.New("no output")
	}
	b1, t1, ok := cpuTimes(lines[0])
	if !ok {
		return m, fmt.Errorf("no cpu line: %.80q", lines[0])
	}
	var b2, t2 uint64
	var memAvail, memFree, buffers int64
	seen := false
	for _, line := range lines[1 : len(lines)-1] {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "cpu":
			if b, t, ok := cpuTimes(line); ok && !seen {
				b2, t2, seen = b, t, true
			}
		case strings.HasPrefix(f[0], "cpu"):
			if _, err := strconv.Atoi(f[0][3:]); err == nil {
				m.CPUCount++
			}
		case len(f) >= 2 && strings.HasSuffix(f[0], ":"):
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				continue
			}
			switch f[0] {
			case "MemTotal:":
				m.MemTotal = kb << 10
			case "MemAvailable:":
				memAvail = kb << 10
			case "MemFree:":
				memFree = kb << 10
			case "Buffers:":
				buffers = kb << 10
			case "Cached:":
				m.MemCache = kb << 10
			}
		}
	}
	if !seen || m.MemTotal == 0 {
		return m, errors.New("no /proc/stat or /proc/meminfo in the output")
	}
	if t2 > t1 && b2 >= b1 {
		m.CPUUsedPct = float64(b2-b1) / float64(t2-t1) * 100
	}
	if memAvail == 0 {
		memAvail = memFree + buffers + m.MemCache
	}
	m.MemUsed = max(m.MemTotal-memAvail, 0)
	// df -P -k: filesystem, 1024-blocks, used, available, capacity, mount.
	if f := strings.Fields(lines[len(lines)-1]); len(f) >= 4 {
		total, err1 := strconv.ParseInt(f[1], 10, 64)
		used, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 == nil && err2 == nil {
			m.DiskTotal, m.DiskUsed = total<<10, used<<10
		}
	}
	return m, nil
}
