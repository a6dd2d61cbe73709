//go:build airlock_testfaults

package cli

import (
	"fmt"
	"os"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// testDriverEnv is TEST-ONLY (builds with the airlock_testfaults tag): set
// to "fake" (or "fake-snapshot", the fake that can snapshot), the airlock
// binary runs its boxes on the fake driver (internal/vmm/fake: the guest
// agent, $AIRLOCK_AGENT, as a host process) instead of QEMU, so that a
// test can run `airlock node` processes, and kill them, without VMs.
const testDriverEnv = "AIRLOCK_TEST_DRIVER"

// openTestDriver opens the runtime on the driver $AIRLOCK_TEST_DRIVER
// names; ok false when it names none.
func openTestDriver(opts airlock.Options) (*airlock.Runtime, bool, error) {
	switch d := os.Getenv(testDriverEnv); d {
	case "":
		return nil, false, nil
	case "fake":
		r, err := airlock.OpenWithTestDriver(opts, fake.New(defaults.Agent()))
		return r, true, err
	case "fake-snapshot":
		r, err := airlock.OpenWithTestDriver(opts, fake.NewSnapshotting(defaults.Agent()))
		return r, true, err
	default:
		return nil, true, fmt.Errorf("%s=%q: want fake or fake-snapshot", testDriverEnv, d)
	}
}
