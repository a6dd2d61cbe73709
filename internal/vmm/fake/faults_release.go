//go:build !airlock_testfaults

package fake

import "errors"

// wedgeEnv returns the environment entry of Driver.TestWedgeExec: a build
// without the airlock_testfaults tag has no such fault, and says so rather
// than run the test without it.
func wedgeEnv() (string, error) {
	return "", errors.New("fake driver: TestWedgeExec needs a build with -tags airlock_testfaults")
}
