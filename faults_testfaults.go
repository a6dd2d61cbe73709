//go:build airlock_testfaults

package airlock

import (
	"sync/atomic"

	"github.com/airlock-run/airlock/internal/vmm"
)

// slirpForBench, set only by the network benchmark in builds with the
// airlock_testfaults tag, gives boxes QEMU's user-mode networking (slirp)
// instead of the helper, to compare the two. It is not a user option and
// not in release builds: slirp lets a box reach the host's loopback.
var slirpForBench atomic.Bool

// benchSlirp reports whether boxes get slirp instead of the helper.
func benchSlirp() bool { return slirpForBench.Load() }

// OpenWithTestDriver is TEST-ONLY (builds with the airlock_testfaults tag):
// Open with boxes on drv (the fake driver) instead of QEMU, for tests that
// run the airlock binary itself as a process (airlock node killed with
// SIGKILL) without booting VMs.
func OpenWithTestDriver(opts Options, drv vmm.Driver) (*Runtime, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return openWith(opts, drv)
}
