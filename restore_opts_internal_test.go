package airlock

import (
	"errors"
	"testing"
)

// restoredHostSide: a restored box takes the caller's hostname, published
// ports and network policy, never the snapshot's box's ports; volumes and
// a policy for a snapshot without network are refused.
func TestRestoredHostSide(t *testing.T) {
	snap := BoxOptions{Image: "python:slim", Network: NetworkPublic, Hostname: "old",
		Ports: []PortMapping{{HostPort: 8080, GuestPort: 80}}, AllowHostPorts: []int{5432}}
	o := snap
	if err := restoredHostSide(&o, BoxOptions{}, "s"); err != nil {
		t.Fatal(err)
	}
	if len(o.Ports) != 0 || o.Hostname != "" || o.Network != NetworkPublic || len(o.AllowHostPorts) != 1 {
		t.Errorf("no caller options: %+v; want no ports, no hostname, the snapshot's policy", o)
	}
	o = snap
	mine := BoxOptions{Hostname: "mine", AllowNet: []string{"pypi.org"}, Ports: []PortMapping{{HostPort: 9090, GuestPort: 80}}}
	if err := restoredHostSide(&o, mine, "s"); err != nil {
		t.Fatal(err)
	}
	if o.Hostname != "mine" || o.Network != NetworkAllowlist || len(o.AllowNet) != 1 || len(o.Ports) != 1 || o.Ports[0].HostPort != 9090 {
		t.Errorf("caller's options: %+v", o)
	}
	o = snap
	if err := restoredHostSide(&o, BoxOptions{Volumes: []Volume{{Source: "/tmp", Target: "/mnt"}}}, "s"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("volumes: %v", err)
	}
	o = BoxOptions{Network: NetworkNone}
	if err := restoredHostSide(&o, BoxOptions{AllowNet: []string{"pypi.org"}}, "s"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("allow-net on a snapshot without network: %v", err)
	}
	o = snap
	if err := restoredHostSide(&o, BoxOptions{Hostname: "bad_name"}, "s"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad hostname: %v", err)
	}
}
