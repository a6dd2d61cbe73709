package boxopts

import (
	"errors"
	"testing"

	"github.com/airlock-run/airlock/internal/boxrecord"
)

// TestRestoredHostSide: a restored box takes the caller's hostname, published
// ports and network policy, never the snapshot's box's ports; volumes and
// a policy for a snapshot without network are refused.
func TestRestoredHostSide(t *testing.T) {
	snap := Options{Image: "python:slim", Network: "public", Hostname: "old",
		Ports: []boxrecord.Port{{HostPort: 8080, GuestPort: 80}}, AllowHostPorts: []int{5432}}
	o := snap
	if err := restoredHostSide(&o, Options{}, "s"); err != nil {
		t.Fatal(err)
	}
	if len(o.Ports) != 0 || o.Hostname != "" || o.Network != "public" || len(o.AllowHostPorts) != 1 {
		t.Errorf("no caller options: %+v; want no ports, no hostname, the snapshot's policy", o)
	}
	o = snap
	mine := Options{Hostname: "mine", AllowNet: []string{"pypi.org"}, Ports: []boxrecord.Port{{HostPort: 9090, GuestPort: 80}}}
	if err := restoredHostSide(&o, mine, "s"); err != nil {
		t.Fatal(err)
	}
	if o.Hostname != "mine" || o.Network != "allowlist" || len(o.AllowNet) != 1 || len(o.Ports) != 1 || o.Ports[0].HostPort != 9090 {
		t.Errorf("caller's options: %+v", o)
	}
	o = snap
	if err := restoredHostSide(&o, Options{Volumes: []boxrecord.Volume{{Source: "/tmp", Target: "/mnt"}}}, "s"); !errors.Is(err, ErrInvalid) {
		t.Errorf("volumes: %v", err)
	}
	o = Options{Network: "none"}
	if err := restoredHostSide(&o, Options{AllowNet: []string{"pypi.org"}}, "s"); !errors.Is(err, ErrInvalid) {
		t.Errorf("allow-net on a snapshot without network: %v", err)
	}
	o = snap
	if err := restoredHostSide(&o, Options{Hostname: "bad_name"}, "s"); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad hostname: %v", err)
	}
}
