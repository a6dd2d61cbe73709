//go:build !airlock_testfaults

package guestabi

// TestFaults reports whether this build carries airlock's test-only
// faults and seams: it does not (build with -tags airlock_testfaults for
// the tests that need them).
const TestFaults = false

// testFaultParam reports whether f is a test-only fault's kernel
// parameter: a release build knows none.
func testFaultParam(string) bool { return false }
