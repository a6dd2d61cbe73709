package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParsePublishGrant(t *testing.T) {
	for in, want := range map[string]string{
		"8000-8099":            "127.0.0.1:8000-8099",
		"0":                    "127.0.0.1:0",
		"127.0.0.1:8080/TCP":   "127.0.0.1:8080/tcp",
		"0.0.0.0:0-65535/udp":  "0.0.0.0:0-65535/udp",
		"[::1]:9000-9001":      "[::1]:9000-9001",
		"[::]:80":              "[::]:80",
		"::ffff:127.0.0.1:443": "127.0.0.1:443",
	} {
		g, err := ParsePublishGrant(in)
		if err != nil || g.String() != want {
			t.Errorf("ParsePublishGrant(%q) = %v, %v; want %s", in, g, err, want)
		}
	}
	for _, in := range []string{"", "x", "8099-8000", "65536", "-1", "localhost:80", "127.0.0.1:80/sctp", "[fe80::1%eth0]:80", "1.2.3:80"} {
		if g, err := ParsePublishGrant(in); err == nil {
			t.Errorf("ParsePublishGrant(%q) = %v, want an error", in, g)
		}
	}
}

// TestPublishPolicy: published ports only as --allow-publish grants them:
// none at all without a grant, none outside a granted range, host_port 0
// only with a range from 0, a non-loopback address only when a grant names
// it (or a wildcard of its family), a protocol only where granted. Every
// refusal is 403 policy_denied naming the flag, before any box is made;
// malformed ports are 400 naming the port's field.
func TestPublishPolicy(t *testing.T) {
	rt := openRuntime(t)
	grant := func(specs ...string) Policy {
		var p Policy
		for _, s := range specs {
			g, err := ParsePublishGrant(s)
			if err != nil {
				t.Fatal(err)
			}
			p.AllowPublish = append(p.AllowPublish, g)
		}
		return p
	}
	none := httptest.NewServer(New(Config{Runtime: rt}).Handler(false))
	defer none.Close()
	ranged := httptest.NewServer(New(Config{Runtime: rt, Policy: grant("127.0.0.1:8000-8099", "[::1]:9000/udp")}).Handler(false))
	defer ranged.Close()
	wide := httptest.NewServer(New(Config{Runtime: rt, Policy: grant("0", "0.0.0.0:7000-7001/tcp")}).Handler(false))
	defer wide.Close()

	post := func(base string, ports ...PortSpec) (int, Problem) {
		t.Helper()
		return postBox(t, base, BoxSpec{Image: "nosuch.invalid/x:1", Ports: ports})
	}
	for _, tc := range []struct {
		name string
		base string
		port PortSpec
		want string // in the detail
	}{
		{"no grant", none.URL, PortSpec{HostPort: 8000, GuestPort: 80}, "grants no published ports (start it with airlock serve --allow-publish 127.0.0.1:"},
		{"no grant, port 0", none.URL, PortSpec{GuestPort: 80}, "--allow-publish"},
		{"above the range", ranged.URL, PortSpec{HostPort: 8100, GuestPort: 80}, "outside what this server grants (127.0.0.1:8000-8099, [::1]:9000/udp"},
		{"below the range", ranged.URL, PortSpec{HostPort: 22, GuestPort: 80}, "--allow-publish"},
		{"port 0 outside a range from 1", ranged.URL, PortSpec{GuestPort: 80}, "host_port 0 needs a grant whose range starts at 0"},
		{"another loopback address", ranged.URL, PortSpec{HostIP: "127.0.0.2", HostPort: 8000, GuestPort: 80}, "outside"},
		{"every interface", ranged.URL, PortSpec{HostIP: "0.0.0.0", HostPort: 8000, GuestPort: 80}, "a non-loopback address needs a grant naming it"},
		{"ipv6 tcp where only udp is granted", ranged.URL, PortSpec{HostIP: "::1", HostPort: 9000, GuestPort: 80}, "outside"},
		{"wildcard grant is per protocol", wide.URL, PortSpec{HostIP: "192.0.2.1", HostPort: 7000, GuestPort: 80, Protocol: "udp"}, "outside"},
		{"ipv4 wildcard does not cover ipv6", wide.URL, PortSpec{HostIP: "::", HostPort: 7000, GuestPort: 80}, "outside"},
		{"port 0 granted on loopback only", wide.URL, PortSpec{HostIP: "0.0.0.0", GuestPort: 80}, "outside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, p := post(tc.base, tc.port)
			if st != 403 || p.Code != CodePolicyDenied || !strings.Contains(p.Detail, tc.want) {
				t.Errorf("%d %+v, want 403 policy_denied with %q", st, p, tc.want)
			}
		})
	}
	// One refused mapping refuses the request, whatever the others.
	if st, p := post(ranged.URL, PortSpec{HostPort: 8000, GuestPort: 80}, PortSpec{HostPort: 8100, GuestPort: 81}); st != 403 || !strings.Contains(p.Detail, ":8100:81/tcp") {
		t.Errorf("second mapping outside: %d %+v", st, p)
	}
	// What the grants let through reaches the library: these fail later
	// (no such image in this empty home), not with 403.
	for _, tc := range []struct {
		base  string
		ports []PortSpec
	}{
		{ranged.URL, []PortSpec{{HostPort: 8000, GuestPort: 80}, {HostIP: "127.0.0.1", HostPort: 8099, GuestPort: 81, Protocol: "udp"}}},
		{ranged.URL, []PortSpec{{HostIP: "::1", HostPort: 9000, GuestPort: 53, Protocol: "udp"}}},
		{wide.URL, []PortSpec{{GuestPort: 80}, {HostIP: "0.0.0.0", HostPort: 7001, GuestPort: 81}, {HostIP: "192.0.2.1", HostPort: 7000, GuestPort: 82}}},
	} {
		if st, p := post(tc.base, tc.ports...); st != 404 || p.Code != CodeImageNotFound {
			t.Errorf("%+v: %d %+v, want the library's 404 image_not_found", tc.ports, st, p)
		}
	}
	// host_port may be left out (0, a free port), as may host_ip and protocol.
	resp0, err := http.Post(wide.URL+"/v1/boxes", "application/json", strings.NewReader(`{"image":"nosuch.invalid/x:1","ports":[{"guest_port":80}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp0.Body.Close()
	if resp0.StatusCode != 404 {
		t.Errorf(`ports [{"guest_port":80}]: %d, want the library's 404`, resp0.StatusCode)
	}
	// Malformed mappings are the client's error.
	for _, pt := range []PortSpec{
		{HostPort: 8000, GuestPort: 0}, {HostPort: 70000, GuestPort: 80}, {HostPort: 8000, GuestPort: 80, Protocol: "sctp"},
		{HostIP: "localhost", HostPort: 8000, GuestPort: 80},
	} {
		if st, p := post(ranged.URL, pt); st != 400 || p.Code != CodeInvalid || len(p.Errors) == 0 || !strings.HasPrefix(p.Errors[0].Pointer, "/ports/0/") {
			t.Errorf("%+v: %d %+v, want 400 invalid_request pointing into /ports/0", pt, st, p)
		}
	}
	// The library's own checks: a port given twice, ports without a network.
	if st, p := post(ranged.URL, PortSpec{HostPort: 8000, GuestPort: 80}, PortSpec{HostPort: 8000, GuestPort: 81}); st != 400 || !strings.Contains(p.Detail, "given twice") {
		t.Errorf("port given twice: %d %+v", st, p)
	}
	b, _ := json.Marshal(BoxSpec{Network: "none", Ports: []PortSpec{{HostPort: 8000, GuestPort: 80}}})
	resp, err := http.Post(ranged.URL+"/v1/boxes", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("ports with network none: %d, want 400", resp.StatusCode)
	}
	if infos, _ := rt.List(t.Context()); len(infos) != 0 {
		t.Errorf("boxes left behind: %+v", infos)
	}
}
