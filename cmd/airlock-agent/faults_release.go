//go:build !airlock_testfaults

package main

// hostTestFaults and guestTestFaults turn on test-only faults: a release
// build has none (see faults_testfaults.go).
func hostTestFaults()  {}
func guestTestFaults() {}
