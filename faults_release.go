//go:build !airlock_testfaults

package airlock

// benchSlirp reports whether boxes get QEMU's slirp instead of the network
// helper: never in a release build (the benchmark's seam is in
// faults_testfaults.go).
func benchSlirp() bool { return false }
