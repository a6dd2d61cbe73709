package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/bench"
)

// TestBenchPrintsVerdictsOnlyWithTargets: 'airlock bench' prints the
// measurements and their ratios; the project's targets and whether each
// was met only with --targets.
func TestBenchPrintsVerdictsOnlyWithTargets(t *testing.T) {
	rep := &bench.Report{Accel: "tcg", Runs: 3, Kernels: []bench.Kernel{
		{Kind: "airlock", Version: "6.1", Bare: 600 * time.Millisecond, ColdStart: 800 * time.Millisecond,
			FirstPython: time.Second, ExecRoundTrip: 3 * time.Millisecond, GuestExec: time.Millisecond,
			IdleRSS: 100 << 10, BareRSS: 90 << 10, PeakRSS: 110 << 10},
		{Kind: "debian", Version: "6.1", Bare: 2 * time.Second, ColdStart: 2200 * time.Millisecond,
			FirstPython: 3 * time.Second, ExecRoundTrip: 3 * time.Millisecond, GuestExec: time.Millisecond,
			IdleRSS: 200 << 10, BareRSS: 190 << 10, PeakRSS: 250 << 10},
	}}
	var plain, targets bytes.Buffer
	writeBench(&plain, rep)
	writeTargets(&targets, rep)
	for _, want := range []string{"accelerator: tcg, medians of 3 runs", "airlock 6.1", "debian 6.1", "1.33", "2.75"} {
		if !strings.Contains(plain.String(), want) {
			t.Errorf("bench output lacks %q:\n%s", want, plain.String())
		}
	}
	for _, verdict := range []string{"met", "missed", "target"} {
		if strings.Contains(plain.String(), verdict) {
			t.Errorf("bench without --targets says %q:\n%s", verdict, plain.String())
		}
	}
	// cold/bare 1.33 misses ≤1.10; Debian/airlock cold start 2.75 meets ≥2.50.
	for _, want := range []string{"1.33 (≤1.10 missed)", "2.75 (≥2.50 met)"} {
		if !strings.Contains(targets.String(), want) {
			t.Errorf("bench --targets lacks %q:\n%s", want, targets.String())
		}
	}
}
