//go:build airlock_testfaults

package airlock

import "github.com/airlock-run/airlock/internal/vmm/qemu"

// wedgeExec turns on d's test-only exec wedge (qemu.WedgeExec).
func wedgeExec(d *qemu.Driver) error {
	qemu.WedgeExec(d)
	return nil
}

// setBenchSlirp gives boxes slirp instead of the network helper (on) or
// the helper again.
func setBenchSlirp(on bool) { slirpForBench.Store(on) }
