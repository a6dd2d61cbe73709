package airlock

import (
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

// OpenWedgedQEMU opens a runtime on the QEMU driver whose guest agents
// never report the end of an exec (tests only: qemu.Options.TestWedgeExec).
func OpenWedgedQEMU(opts Options) (*Runtime, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	qo := qemuOptions(opts)
	qo.TestWedgeExec = true
	return openWith(opts, qemu.New(qo))
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

// HostSlack is how long the host waits past an exec's timeout and grace
// for the agent's report (tests only).
const HostSlack = hostSlack
