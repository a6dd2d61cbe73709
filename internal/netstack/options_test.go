package netstack

import (
	"strings"
	"testing"
)

func TestCheckOptions(t *testing.T) {
	for in, want := range map[[2]string]string{{"", ""}: ModePublic, {"", "x.org"}: ModeAllowlist, {ModeEnabled, ""}: ModePublic, {ModeDisabled, ""}: ModeNone, {"odd", ""}: "odd"} {
		var allow []string
		if in[1] != "" {
			allow = []string{in[1]}
		}
		if got := CanonicalMode(in[0], allow); got != want {
			t.Errorf("CanonicalMode(%q, %v) = %q, want %q", in[0], allow, got, want)
		}
	}
	pub := []Publish{{HostPort: 8080, GuestPort: 80}, {HostIP: "0.0.0.0", HostPort: 0, GuestPort: 53, Proto: "udp"}}
	if err := CheckOptions(ModePublic, nil, nil, []int{5432}, pub); err != nil {
		t.Fatal(err)
	}
	if pub[0] != (Publish{HostIP: "127.0.0.1", HostPort: 8080, GuestPort: 80, Proto: "tcp"}) || pub[1].HostIP != "0.0.0.0" {
		t.Errorf("defaults not filled in: %+v", pub)
	}
	for _, c := range []struct {
		mode  string
		allow []string
		ports []int
		pub   []Publish
		want  string
	}{
		{ModeNone, []string{"x.org"}, nil, nil, "allow-net entries need"},
		{ModeNone, nil, []int{1}, nil, "allow-host-port needs a network"},
		{ModeNone, nil, nil, []Publish{{HostPort: 1, GuestPort: 1}}, "published ports (-p) need a network"},
		{"enabled", nil, nil, nil, `network "enabled": want`},
		{ModePublic, nil, nil, []Publish{{HostPort: 8080, GuestPort: 80}, {HostPort: 8080, GuestPort: 81}}, "given twice"},
		{ModePublic, nil, nil, []Publish{{HostPort: 1, GuestPort: 70000}}, "publish"},
		{ModeAllowlist, []string{"not a rule!"}, nil, nil, ""},
	} {
		err := CheckOptions(c.mode, c.allow, nil, c.ports, c.pub)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckOptions(%q, %v, %v, %+v) = %v, want %q", c.mode, c.allow, c.ports, c.pub, err, c.want)
		}
	}
	if p := BoxPolicy(ModeNone, []string{"x.org"}, nil, []int{1}); p.Mode != ModeAllowlist || p.Allow != nil || p.HostPorts != nil {
		t.Errorf("BoxPolicy(none) = %+v, want an allowlist of nothing", p)
	}
}
