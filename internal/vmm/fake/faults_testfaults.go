//go:build airlock_testfaults

package fake

import "github.com/airlock-run/airlock/internal/guestabi"

// wedgeEnv returns the environment entry of Driver.TestWedgeExec.
func wedgeEnv() (string, error) { return guestabi.HostTestWedgeExecEnv + "=1", nil }
