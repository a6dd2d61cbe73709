//go:build airlock_testfaults

package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/airlock-run/airlock/internal/agent"
	"github.com/airlock-run/airlock/internal/guestabi"
)

// hostTestFaults turns on the test-only faults a host-mode agent's
// environment asks for (the fake driver's TestWedgeExec).
func hostTestFaults() {
	setTestFaults(os.Getenv(guestabi.HostTestWedgeExecEnv) == "1")
}

// guestTestFaults turns on the test-only faults the kernel command line
// asks for (the QEMU driver's WedgeExec).
func guestTestFaults() {
	cmdline, _ := os.ReadFile("/proc/cmdline")
	setTestFaults(slices.Contains(strings.Fields(string(cmdline)), guestabi.TestWedgeExecParam))
}

func setTestFaults(wedge bool) {
	agent.TestWedgeExec = wedge
	if wedge {
		fmt.Fprintf(os.Stderr, "%stest fault: exec wedged\n", guestabi.LogPrefix)
	}
}
