package qemu

import "time"

func rdtsc() uint64

// hostTSCkHz measures the host's time-stamp counter rate. Under TCG the
// guest's TSC is the host's, so this is the rate to tell the guest kernel
// (tsc_early_khz): with a wrong value the guest clock runs fast or slow, and
// every timeout and sleep in the box with it.
func hostTSCkHz() uint64 {
	best := uint64(0)
	var bestErr time.Duration = 1 << 62
	// Take the shortest of a few windows: the least disturbed by scheduling.
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		c0 := rdtsc()
		time.Sleep(15 * time.Millisecond)
		c1 := rdtsc()
		d := time.Since(t0)
		if over := d - 15*time.Millisecond; over < bestErr && d > 0 {
			bestErr = over
			best = (c1 - c0) * uint64(time.Millisecond) / uint64(d)
		}
	}
	return best
}
