//go:build !airlock_testfaults

package agent

// wedgeExec reports whether the exec handler plays wedged: never in a
// release build (the test-only fault is in faults_testfaults.go).
func wedgeExec() bool { return false }
