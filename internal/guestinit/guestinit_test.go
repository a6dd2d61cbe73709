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

func TestParseVolumes(t *testing.T) {
	vols, err := ParseVolumes("ro root=/dev/vda airlock.vol=9p:airlock.vol0:2f7372632f61206220:ro airlock.vol=blk:vdd:2f64617461:rw quiet")
	if err != nil || len(vols) != 2 {
		t.Fatalf("%+v %v", vols, err)
	}
	if v := vols[0]; v.Kind != "9p" || v.Source != "airlock.vol0" || v.Target != "/src/a b " || !v.ReadOnly {
		t.Errorf("%+v", v)
	}
	if v := vols[1]; v.Kind != "blk" || v.Source != "vdd" || v.Target != "/data" || v.ReadOnly {
		t.Errorf("%+v", v)
	}
	for _, bad := range []string{"airlock.vol=9p:x", "airlock.vol=9p:x:zz:ro", "airlock.vol=9p:x:7265:ro"} {
		if _, err := ParseVolumes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
