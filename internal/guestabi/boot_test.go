package guestabi

import (
	"reflect"
	"strings"
	"testing"
)

func TestBootRoundTrip(t *testing.T) {
	for _, b := range []Boot{
		Defaults(),
		{Root: "/dev/vdb", RootFSType: "erofs", RW: "/dev/vdc", Port: PortPrefix, Hostname: "web-1", Net: NetUser, Ports: 4, KernelIP: true},
		{Root: "/dev/vda", RootFSType: "ext4", RW: "/dev/vdb", Port: "other.", Hostname: "0123456789ab", VsockPort: 1024, Debug: true},
	} {
		line := "console=ttyS0 quiet " + strings.Join(b.Args(), " ") + " panic=-1"
		if got := ParseCmdline(line); !reflect.DeepEqual(got, b) {
			t.Errorf("%q:\n got %+v\nwant %+v", line, got, b)
		}
	}
}

func TestParseCmdline(t *testing.T) {
	p := ParseCmdline("console=ttyS0 " + UserNetIPParam + " airlock.net=user airlock.rw=/dev/vdc airlock.ports=4 airlock.debug=1")
	if p.Net != NetUser || p.RW != "/dev/vdc" || p.Ports != 4 || !p.Debug || !p.KernelIP || p.Root != "/dev/vda" {
		t.Fatalf("%+v", p)
	}
	for _, c := range []string{"", "ip=off", "ip=none", "airlock.net=user"} {
		if ParseCmdline(c).KernelIP {
			t.Errorf("%q: KernelIP set", c)
		}
	}
	if p := ParseCmdline("airlock.ports=x airlock.vsock=-1"); p.Ports != 0 || p.VsockPort != 0 {
		t.Errorf("malformed numbers: %+v", p)
	}
}

// TestKnownParamTestFault: only a build with the airlock_testfaults tag
// knows the test-only exec wedge's kernel parameter.
func TestKnownParamTestFault(t *testing.T) {
	if got := KnownParam("airlock.test_wedge_exec=1"); got != TestFaults {
		t.Errorf("KnownParam(airlock.test_wedge_exec=1) = %v in a build with TestFaults = %v", got, TestFaults)
	}
	if KnownParam("airlock.test_wedge_exec=0") || KnownParam("airlock.test_wedge_exec") {
		t.Error("a wedge parameter airlock never writes is known")
	}
}
