package airlock

import (
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{3}, 3},
		{[]time.Duration{5, 1, 3}, 3},
		{[]time.Duration{4, 1}, 2},
		{[]time.Duration{10, 1, 7, 2}, 4},
	} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestReadaheadCoversTheDisk(t *testing.T) {
	for _, c := range []struct {
		size int64
		want int
	}{
		{1, 1 << 20},
		{2 << 20, 1 << 20},
		{7774208, 4 << 20}, // an agent disk: 7.4 MiB, readahead 8 MiB
		{9 << 20, 5 << 20},
	} {
		got := readaheadFor(c.size)
		if got != c.want || int64(2*got) < c.size {
			t.Errorf("readaheadFor(%d) = %d, want %d", c.size, got, c.want)
		}
	}
}
