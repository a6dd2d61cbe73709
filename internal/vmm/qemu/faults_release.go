//go:build !airlock_testfaults

package qemu

// testFaultArgs returns the kernel parameters of d's test-only faults:
// none in a release build (see faults_testfaults.go).
func (d *Driver) testFaultArgs() []string { return nil }
