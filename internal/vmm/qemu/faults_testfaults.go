//go:build airlock_testfaults

package qemu

import (
	"sync"

	"github.com/airlock-run/airlock/internal/guestabi"
)

// wedged holds the drivers WedgeExec was called on.
var wedged sync.Map // *Driver → struct{}

// WedgeExec is a TEST-ONLY fault, in builds with the airlock_testfaults
// tag only: the guest agent of every box d starts from now on never
// reports the end of an exec (guestabi.TestWedgeExecParam). The agent must
// be built with the same tag (vmtest.BuildAgent does so in such builds).
func WedgeExec(d *Driver) { wedged.Store(d, struct{}{}) }

// testFaultArgs returns the kernel parameters of d's test-only faults.
func (d *Driver) testFaultArgs() []string {
	if _, ok := wedged.Load(d); ok {
		return []string{guestabi.TestWedgeExecParam}
	}
	return nil
}
