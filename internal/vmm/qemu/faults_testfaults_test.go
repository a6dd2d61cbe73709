//go:build airlock_testfaults

package qemu

import (
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/vmm"
)

// TestWedgeExecCmdline: a driver WedgeExec was called on writes the
// wedge's kernel parameter, which CheckCmdline accepts in this build;
// other drivers do not write it.
func TestWedgeExecCmdline(t *testing.T) {
	spec := vmm.Spec{ID: "0123456789ab", Dir: t.TempDir(), CPUs: 1, MemoryMiB: 256}
	boot := &bootAssets{accel: AccelChoice{Accel: AccelTCG}, agentDisk: "/agent.erofs"}
	d := New(Options{})
	WedgeExec(d)
	c := d.config(spec, boot, "/base", 0).Cmdline
	if !strings.Contains(" "+c+" ", " "+guestabi.TestWedgeExecParam+" ") {
		t.Fatalf("wedged driver's command line lacks %s: %s", guestabi.TestWedgeExecParam, c)
	}
	if err := CheckCmdline(c); err != nil {
		t.Fatal(err)
	}
	if c := New(Options{}).config(spec, boot, "/base", 0).Cmdline; strings.Contains(c, "wedge") {
		t.Fatalf("other driver wedged too: %s", c)
	}
}
