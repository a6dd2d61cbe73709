package e2b

import (
	"testing"
	"time"
)

// The metrics script's output (a box's /proc and df) becomes E2B's
// SandboxMetric: the busy share of CPU time between the two samples,
// memory used as total less available, the root filesystem in bytes.
func TestParseMetrics(t *testing.T) {
	out := `cpu  100 0 100 700 100 0 0 0 0 0
cpu  160 0 140 1000 100 0 0 0 50 0
cpu0 80 0 70 500 50 0 0 0 0 0
cpu1 80 0 70 500 50 0 0 0 0 0
intr 12345
MemTotal:        1000000 kB
MemFree:          200000 kB
MemAvailable:     600000 kB
Buffers:           10000 kB
Cached:           300000 kB
/dev/vda        10000000 2500000 7500000  25% /
`
	m, err := parseMetrics(out, time.Unix(1700000000, 0))
	if err != nil {
		t.Fatal(err)
	}
	// busy 200 -> 300 of total 1000 -> 1400 (guest time is in user already).
	want := sandboxMetric{Timestamp: "2023-11-14T22:13:20Z", TimestampUnix: 1700000000, CPUCount: 2, CPUUsedPct: 25,
		MemTotal: 1000000 << 10, MemUsed: 400000 << 10, MemCache: 300000 << 10, DiskTotal: 10000000 << 10, DiskUsed: 2500000 << 10}
	if m != want {
		t.Fatalf("got  %+v\nwant %+v", m, want)
	}
	for _, bad := range []string{"", "garbage\nmore\nlines", "cpu 1 2 3 4\nMemTotal: 5 kB\n/dev/vda 1 1 0 100% /"} {
		if _, err := parseMetrics(bad, time.Now()); err == nil {
			t.Errorf("parseMetrics(%q): no error", bad)
		}
	}
}
