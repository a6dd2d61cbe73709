package guestabi

import (
	"strings"
	"testing"
)

func TestVolumeRoundTrip(t *testing.T) {
	in := []Volume{
		{Kind: VolumeKind9p, Source: "airlock.vol0", Target: "/src/a b ", ReadOnly: true},
		{Kind: VolumeKindDisk, Source: "vdd", Target: "/data"},
		{Kind: VolumeKindVirtioFS, Source: "airlock.vol2", Target: "/src"},
	}
	cmdline := "ro root=/dev/vda " + in[0].Arg() + " " + in[1].Arg() + " " + in[2].Arg() + " quiet"
	out, err := ParseVolumes(cmdline)
	if err != nil || len(out) != len(in) {
		t.Fatalf("%+v %v", out, err)
	}
	for i := range in {
		if out[i] != in[i] {
			t.Errorf("volume %d: got %+v, want %+v", i, out[i], in[i])
		}
	}
	if strings.Contains(cmdline, "a b") {
		t.Errorf("target not encoded: %s", cmdline)
	}
	for _, bad := range []string{"airlock.vol=9p:x", "airlock.vol=9p:x:zz:ro", "airlock.vol=9p:x:7265:ro", "airlock.vol=nfs:x:2f61:ro", "airlock.vol=9p:x:2f61:rx"} {
		if _, err := ParseVolumes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
