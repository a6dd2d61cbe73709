package boxrecord

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestGolden: the stored form, byte for byte (the root package's
// TestRecordGolden checks it from the public options). A change here
// changes what state.db holds and what older releases read.
func TestGolden(t *testing.T) {
	r := Record{Version: 7, Image: "a", CPUs: 1, MemoryMiB: 512, DiskSizeMiB: 4096, Network: NetNone,
		Ports:   []Port{{HostPort: 80, GuestPort: 8000}},
		Volumes: []Volume{{Source: "v", Target: "/v"}}, TTLMs: 1}
	const want = `{"v":1,"image":"a","cpus":1,"memory_mib":512,"disk_mib":4096,"network":"none","ports":[{"host_port":80,"guest_port":8000}],"image_config":{},"volumes":[{"source":"v","target":"/v"}],"ttl_ms":1}`
	if got := string(Encode(r)); got != want {
		t.Errorf("stored form:\n got %s\nwant %s", got, want)
	}
	got, err := Decode([]byte(want))
	r.Version = Version
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Errorf("read back: %+v %v", got, err)
	}
}

// TestDecodeV0: records written before versions (the public options
// marshalled as is) read as the current version.
func TestDecodeV0(t *testing.T) {
	v0 := `{"options":{"Image":"a","Name":"","CPUs":1,"MemoryMiB":512,"DiskSizeMiB":4096,"Env":null,"WorkingDir":"","User":"","AutoRemove":true,"Network":"disabled"},"image":{"Env":["X=1"],"WorkingDir":"","User":"","Entrypoint":null,"Cmd":["sh"],"Labels":null},"owner_pid":5}`
	r, err := Decode([]byte(v0))
	want := Record{Version: 1, Image: "a", CPUs: 1, MemoryMiB: 512, DiskSizeMiB: 4096, AutoRemove: true, Network: NetNone,
		ImageConfig: Image{Env: []string{"X=1"}, Cmd: []string{"sh"}}, OwnerPID: 5}
	if err != nil || !reflect.DeepEqual(r, want) {
		t.Fatalf("got %+v %v\nwant %+v", r, err, want)
	}
	up, err := Upgrade([]byte(v0))
	if err != nil || !strings.Contains(string(up), `"network":"none"`) || !strings.Contains(string(up), `"v":1`) {
		t.Fatalf("upgraded: %s %v", up, err)
	}
	// Version 0 kept any mode but "disabled" as public.
	for stored, want := range map[string]string{"enabled": NetPublic, "": NetPublic, "sideways": NetPublic, "allowlist": NetAllowlist, "none": NetNone} {
		if r, _ := Decode([]byte(`{"options":{"Network":"` + stored + `"}}`)); r.Network != want {
			t.Errorf("version 0 mode %q read as %q, want %q", stored, r.Network, want)
		}
	}
	// Records the network branch stored before versions carry its policy.
	v0net := `{"options":{"Image":"a","Network":"allowlist","AllowNet":["pypi.org"],"AllowHostPorts":[8080],"Ports":[{"host_port":80,"guest_port":8000,"protocol":"tcp"}]}}`
	r, err = Decode([]byte(v0net))
	if err != nil || r.Network != NetAllowlist || !reflect.DeepEqual(r.AllowNet, []string{"pypi.org"}) || !reflect.DeepEqual(r.AllowHostPorts, []int{8080}) ||
		!reflect.DeepEqual(r.Ports, []Port{{HostPort: 80, GuestPort: 8000, Protocol: "tcp"}}) {
		t.Fatalf("network policy of a version 0 record: %+v %v", r, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	if _, err := Decode([]byte(`{"v":99}`)); err == nil || !strings.Contains(err.Error(), "upgrade airlock") {
		t.Errorf("newer version: %v", err)
	}
	if _, err := Decode([]byte(`not json`)); err == nil {
		t.Error("not json decoded")
	}
	if _, err := Network("sideways"); err == nil || err.Error() != `unknown network mode "sideways"` {
		t.Errorf("unknown mode: %v", err)
	}
	if _, err := Upgrade([]byte(`{"v":1,"network":"sideways"}`)); err == nil {
		t.Error("a record with an unknown mode upgraded")
	}
}

func TestUnits(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 0, -time.Second: 0, time.Microsecond: 1, time.Millisecond: 1, 1500 * time.Microsecond: 2, math.MaxInt64: math.MaxInt64/int64(time.Millisecond) + 1} {
		if got := Ms(d); got != want {
			t.Errorf("Ms(%v) = %d, want %d", d, got, want)
		}
	}
	for ms, want := range map[int64]time.Duration{0: 0, -1: 0, 1: time.Millisecond, math.MaxInt64: math.MaxInt64, math.MaxInt64 / int64(time.Millisecond): math.MaxInt64 / time.Millisecond * time.Millisecond} {
		if got := Duration(ms); got != want {
			t.Errorf("Duration(%d) = %v, want %v", ms, got, want)
		}
	}
	if UnixMs(time.Time{}) != 0 || !Time(0).IsZero() || !Time(UnixMs(time.UnixMilli(-3))).Equal(time.UnixMilli(-3)) {
		t.Error("times")
	}
}
