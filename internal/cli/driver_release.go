//go:build !airlock_testfaults

package cli

import "github.com/airlock-run/airlock"

// openTestDriver never opens a runtime: only builds with the
// airlock_testfaults tag have the test driver seam (driver_testfaults.go).
func openTestDriver(opts airlock.Options) (*airlock.Runtime, bool, error) { return nil, false, nil }
