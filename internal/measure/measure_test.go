package measure

import (
	"os"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{{nil, 0}, {[]time.Duration{3}, 3}, {[]time.Duration{5, 1, 3}, 3}, {[]time.Duration{4, 1, 3, 2}, 2}} {
		in := append([]time.Duration(nil), c.in...)
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Fatalf("Median changed its input: %v", c.in)
			}
		}
	}
	if got := Median([]float64{1, 2}); got != 1.5 {
		t.Errorf("Median of floats = %v", got)
	}
}

func TestProcStatusKiB(t *testing.T) {
	if v := ProcStatusKiB(os.Getpid(), "VmRSS"); v <= 0 {
		t.Errorf("VmRSS of this process: %d", v)
	}
	if v := ProcStatusKiB(os.Getpid(), "NoSuchField"); v != 0 {
		t.Errorf("missing field: %d", v)
	}
}
