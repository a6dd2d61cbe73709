package airlock

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/capacity"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/snapmeta"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// OpenWithDriver opens a runtime whose boxes run on drv (tests only: the
// fake driver).
func OpenWithDriver(opts Options, drv vmm.Driver) (*Runtime, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return openWith(opts, drv)
}

// RequireTestFaults skips t, saying why, unless this test binary carries
// the test-only faults and seams (go test -tags airlock_testfaults, as
// hack/test.sh runs the tests that need them).
func RequireTestFaults(t testing.TB) {
	t.Helper()
	if !guestabi.TestFaults {
		t.Skip("needs the test-only faults: go test -tags airlock_testfaults (hack/test.sh passes it)")
	}
}

// OpenWedgedQEMU opens a runtime on the QEMU driver whose guest agents
// never report the end of an exec (tests only: qemu.WedgeExec, in builds
// with the airlock_testfaults tag; without it, an error says so).
func OpenWedgedQEMU(opts Options) (*Runtime, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	d := qemu.New(qemuOptions(opts))
	if err := wedgeExec(d); err != nil {
		return nil, err
	}
	return openWith(opts, d)
}

// OpenConfinedWithout opens a runtime on the QEMU driver whose boxes are
// confined without the given layers (tests only: benchmarks of what each
// layer costs, qemu.JailOptions.TestWithout).
func OpenConfinedWithout(opts Options, layers ...qemu.Layer) (*Runtime, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	qo := qemuOptions(opts)
	qo.Jail.TestWithout = layers
	return openWith(opts, qemu.New(qo))
}

// BoxOverheadMiB is the host memory the capacity caps count for each box
// besides its guest memory.
const BoxOverheadMiB = capacity.OverheadMiB

// WriteTestSnapshot records a snapshot named name of box b in its home as
// Box.Snapshot does, without its memory or disk (tests only: the snapshot
// caps, on a driver that cannot snapshot).
func WriteTestSnapshot(b *Box, name string) error {
	rec, cfg := b.snapshot()
	dir := filepath.Join(b.r.snapshotsDir(), name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	m := snapmeta.Meta{Version: 1, Name: name, Box: b.id, Created: time.Now().UTC(), Image: rec.Image,
		ImageDigest: rec.ImageDigest, Config: encodeConfig(cfg), Driver: b.r.drv.Name()}
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, snapmeta.File), raw, 0o600)
}

// HostSlack is how long the host waits past an exec's timeout and grace
// for the agent's report (tests only).
const HostSlack = hostSlack
