//go:build airlock_testfaults

package agent

// TestWedgeExec is a TEST-ONLY fault, in builds with the airlock_testfaults
// tag only: every Exec handler of this process starts the process and
// forwards its output, but never enforces its timeout nor reports its
// exit, as a wedged agent would. The guest agent sets it from
// guestabi.TestWedgeExecParam (or guestabi.HostTestWedgeExecEnv in host
// mode) before it serves.
var TestWedgeExec bool

// wedgeExec reports whether the exec handler plays wedged.
func wedgeExec() bool { return TestWedgeExec }
