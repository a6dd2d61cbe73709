package airlock

import "github.com/airlock-run/airlock/internal/vmm"

// OpenWithDriver opens a runtime whose boxes run on drv (tests only: the
// fake driver).
func OpenWithDriver(opts Options, drv vmm.Driver) (*Runtime, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return openWith(opts, drv)
}
