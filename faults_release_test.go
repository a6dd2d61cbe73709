//go:build !airlock_testfaults

package airlock

import (
	"errors"

	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// wedgeExec fails: without the airlock_testfaults tag there is no wedge.
func wedgeExec(*qemu.Driver) error {
	return errors.New("the exec wedge is a test-only fault: go test -tags airlock_testfaults")
}

// setBenchSlirp does nothing: without the airlock_testfaults tag there is
// no slirp seam (BenchmarkNetwork skips first).
func setBenchSlirp(bool) {}
