//go:build airlock_testfaults

package guestabi

// TestFaults reports whether this build carries airlock's test-only
// faults and seams (built with -tags airlock_testfaults). Release builds
// carry none of them: their agent has no wedge and their kernel command
// line check refuses TestWedgeExecParam.
const TestFaults = true

// TestWedgeExecParam on the kernel command line is a TEST-ONLY fault: the
// guest agent's exec handler starts the process and forwards its output
// but never enforces its timeout nor reports its exit, as a wedged agent
// would. Only builds with the airlock_testfaults tag write it (the QEMU
// driver's WedgeExec), read it (the agent) or accept it (KnownParam).
const TestWedgeExecParam = "airlock.test_wedge_exec=1"

// HostTestWedgeExecEnv=1 in a host-mode agent's environment is the same
// fault for the fake VM driver (fake.Driver.TestWedgeExec).
const HostTestWedgeExecEnv = "AIRLOCK_AGENT_TEST_WEDGE_EXEC"

// testFaultParam reports whether f is a test-only fault's kernel parameter.
func testFaultParam(f string) bool { return f == TestWedgeExecParam }
