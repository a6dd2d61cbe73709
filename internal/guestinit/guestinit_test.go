//go:build linux

package guestinit

import "testing"

func TestParseCmdline(t *testing.T) {
	p := ParseCmdline("console=ttyS0 ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off airlock.net=user airlock.rw=/dev/vdc airlock.ports=4 airlock.debug=1")
	if !p.KernelIP || p.Net != "user" || p.RW != "/dev/vdc" || p.Ports != 4 || !p.Debug || p.Root != "/dev/vda" {
		t.Fatalf("%+v", p)
	}
	for _, c := range []string{"console=ttyS0", "ip=off", "ip=none", "ip="} {
		if ParseCmdline(c).KernelIP {
			t.Errorf("%q: KernelIP set", c)
		}
	}
}
