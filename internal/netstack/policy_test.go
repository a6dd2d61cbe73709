package netstack

import (
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/time/rate"
)

func TestParseRule(t *testing.T) {
	good := map[string]string{
		"api.example.com":        "api.example.com",
		"API.Example.com.":       "api.example.com",
		"*.example.org":          "*.example.org",
		"*.example.org:443":      "*.example.org:443",
		"203.0.113.7":            "203.0.113.7",
		"203.0.113.9/24:443":     "203.0.113.0/24:443",
		"2001:db8::/32":          "2001:db8::/32",
		"[2001:db8::1]:8443":     "[2001:db8::1]:8443",
		"pypi.org:443":           "pypi.org:443",
		"files.pythonhosted.org": "files.pythonhosted.org",
	}
	for in, want := range good {
		r, err := ParseRule(in)
		if err != nil {
			t.Errorf("ParseRule(%q): %v", in, err)
			continue
		}
		if r.String() != want {
			t.Errorf("ParseRule(%q) = %q, want %q", in, r.String(), want)
		}
	}
	bad := map[string]string{
		"":                  "empty",
		"10.0.0.0/33":       "malformed CIDR",
		"300.1.2.3":         "malformed IP",
		"example.com:0":     "out of range",
		"example.com:70000": "out of range",
		"api.*.example.com": "wildcard may only be",
		"*":                 "wildcard",
		"*.com":             "two labels",
		"exa mple.com":      "bad character",
		"[2001:db8::1":      "missing ]",
	}
	for in, want := range bad {
		_, err := ParseRule(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRule(%q) = %v, want an error with %q", in, err, want)
		}
	}
}

func TestPolicyValidate(t *testing.T) {
	for _, p := range []Policy{
		{Mode: "open"},
		{Mode: ModePublic, Allow: []string{"example.com"}},
		{Mode: ModeAllowlist, HostPorts: []int{0}},
		{Mode: ModeAllowlist, Allow: []string{"a.*.b"}},
		{Mode: ModeAllowlist, Allow: []string{"127.0.0.1:5432"}},
		{Mode: ModeAllowlist, Allow: []string{"169.254.169.254"}},
		{Mode: ModeAllowlist, Allow: []string{"10.0.2.2:80"}},
	} {
		if p.Validate() == nil {
			t.Errorf("%+v: no error", p)
		}
	}
	if err := (Policy{Mode: ModeAllowlist, Allow: []string{"example.com", "0.0.0.0/0:443", "192.168.0.0/16"}, HostPorts: []int{5432}}).Validate(); err != nil {
		t.Error(err)
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestCheckPublic(t *testing.T) {
	e, err := NewEngine(Policy{Mode: ModePublic, HostPorts: []int{5432}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.hostAddrs[netip.MustParseAddr("198.51.100.77")] = true // as if the host had this address
	cases := []struct {
		dst    string
		allow  bool
		reason string
	}{
		{"93.184.216.34:443", true, ""},
		{"8.8.8.8:53", true, ""},
		{"127.0.0.1:80", false, "host loopback"},
		{"127.5.5.5:80", false, "host loopback"},
		{"198.51.100.77:22", false, "host address"},
		{"10.1.2.3:80", false, "RFC 1918"},
		{"172.16.0.1:80", false, "RFC 1918"},
		{"192.168.1.1:80", false, "RFC 1918"},
		{"100.64.0.1:80", false, "CGNAT"},
		{"169.254.169.254:80", false, "link-local"},
		{"224.0.0.251:5353", false, "multicast"},
		{"255.255.255.255:67", false, "broadcast"},
		{"0.0.0.0:80", false, "this-network"},
		{"10.0.2.2:80", false, "gateway"},
		{"10.0.2.3:80", false, "gateway"},
		{"10.0.2.9:80", false, "box network"},
		{"[::1]:80", false, "loopback"},
		{"[fd00::1]:80", false, "ULA"},
		{"[fe80::1]:80", false, "link-local"},
	}
	for _, c := range cases {
		v := e.Check("tcp", ap(c.dst))
		if v.Allow != c.allow || !strings.Contains(v.Reason, c.reason) {
			t.Errorf("%s: %+v, want allow=%v reason~%q", c.dst, v, c.allow, c.reason)
		}
	}
	v := e.Check("tcp", ap("10.0.2.2:5432"))
	if !v.Allow || v.Dial != ap("127.0.0.1:5432") {
		t.Errorf("host port: %+v, want 127.0.0.1:5432", v)
	}
}

func TestCheckAllowlist(t *testing.T) {
	e, err := NewEngine(Policy{Mode: ModeAllowlist, Allow: []string{"api.example.com:443", "*.example.org", "203.0.113.0/24", "192.168.7.7:8080"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"api.example.com", "a.example.org", "b.c.example.org", HostName} {
		if !e.NameAllowed(n) {
			t.Errorf("name %s not allowed", n)
		}
	}
	for _, n := range []string{"example.org", "example.com", "evil.com", "api.example.com.evil.com"} {
		if e.NameAllowed(n) {
			t.Errorf("name %s allowed", n)
		}
	}
	if v := e.Check("tcp", ap("198.51.100.1:443")); v.Allow {
		t.Errorf("unresolved address allowed: %+v", v)
	}
	if why := e.Resolved("api.example.com", netip.MustParseAddr("198.51.100.1")); why != "" {
		t.Fatal(why)
	}
	if v := e.Check("tcp", ap("198.51.100.1:443")); !v.Allow {
		t.Errorf("resolved address denied: %+v", v)
	}
	if v := e.Check("tcp", ap("198.51.100.1:80")); v.Allow {
		t.Errorf("resolved address on another port allowed: %+v", v)
	}
	if v := e.Check("tcp", ap("203.0.113.50:22")); !v.Allow {
		t.Errorf("listed CIDR denied: %+v", v)
	}
	if v := e.Check("udp", ap("203.0.113.50:53")); v.Allow {
		t.Errorf("DNS to a listed address allowed: %+v", v)
	}
	if v := e.Check("tcp", ap("192.168.7.7:8080")); !v.Allow {
		t.Errorf("listed private address denied: %+v", v)
	}
	if v := e.Check("tcp", ap("192.168.7.8:8080")); v.Allow {
		t.Errorf("unlisted private address allowed: %+v", v)
	}
	wide, _ := NewEngine(Policy{Mode: ModeAllowlist, Allow: []string{"0.0.0.0/0:443"}}, nil)
	if v := wide.Check("tcp", ap("198.51.100.9:443")); !v.Allow {
		t.Errorf("0.0.0.0/0:443 does not open a public address: %+v", v)
	}
	if v := wide.Check("tcp", ap("192.168.1.1:443")); v.Allow {
		t.Errorf("0.0.0.0/0:443 opens a private address: %+v", v)
	}
	// Rebinding: a listed name resolving to loopback or a private range.
	for _, a := range []string{"127.0.0.1", "10.0.0.5", "169.254.169.254"} {
		if why := e.Resolved("api.example.com", netip.MustParseAddr(a)); why == "" {
			t.Errorf("%s accepted as an answer", a)
		}
	}
	if why := e.Resolved("x.example.org", netip.MustParseAddr("192.168.7.7")); why != "" {
		t.Errorf("answer in a listed CIDR refused: %s", why)
	}
}

func TestSetPolicyClosesFlows(t *testing.T) {
	e, _ := NewEngine(Policy{Mode: ModePublic}, nil)
	closed := map[string]bool{}
	for _, d := range []string{"198.51.100.1:443", "203.0.113.1:443"} {
		d := d
		e.track(&flow{proto: "tcp", dst: ap(d), close: func() { closed[d] = true }})
	}
	n, err := e.SetPolicy(Policy{Mode: ModeAllowlist, Allow: []string{"203.0.113.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || !closed["198.51.100.1:443"] || closed["203.0.113.1:443"] {
		t.Fatalf("closed %d: %v", n, closed)
	}
	if e.Stats().Denied != 1 {
		t.Errorf("denied = %d", e.Stats().Denied)
	}
}

func TestTestInternetOverride(t *testing.T) {
	t.Setenv(TestInternetEnv, "198.18.0.0/24")
	e, _ := NewEngine(Policy{Mode: ModePublic}, nil)
	if v := e.Check("tcp", ap("198.18.0.2:80")); !v.Allow || v.Dial != ap("127.0.0.2:80") {
		t.Errorf("test-internet address: %+v, want dialed at 127.0.0.2:80", v)
	}
	if v := e.Check("tcp", ap("198.19.0.2:80")); !v.Allow || v.Dial != ap("198.19.0.2:80") {
		t.Errorf("address outside the test range: %+v", v)
	}
	if v := e.Check("tcp", ap("127.0.0.2:80")); v.Allow {
		t.Errorf("loopback allowed: %+v", v)
	}
}

func TestParsePublish(t *testing.T) {
	good := map[string]Publish{
		"8080:80":             {HostIP: "127.0.0.1", HostPort: 8080, GuestPort: 80, Proto: "tcp"},
		"0.0.0.0:8080:80/udp": {HostIP: "0.0.0.0", HostPort: 8080, GuestPort: 80, Proto: "udp"},
		"0:80":                {HostIP: "127.0.0.1", HostPort: 0, GuestPort: 80, Proto: "tcp"},
		"[::1]:9000:90":       {HostIP: "::1", HostPort: 9000, GuestPort: 90, Proto: "tcp"},
	}
	for in, want := range good {
		p, err := ParsePublish(in)
		if err != nil || p != want {
			t.Errorf("ParsePublish(%q) = %+v, %v; want %+v", in, p, err, want)
		}
	}
	for _, in := range []string{"80", "8080:0", "70000:80", "x:80", "1.2.3:80:80", "80:80/sctp"} {
		if _, err := ParsePublish(in); err == nil {
			t.Errorf("ParsePublish(%q): no error", in)
		}
	}
}

func TestDenyLogRateLimit(t *testing.T) {
	var log strings.Builder
	e, _ := NewEngine(Policy{Mode: ModePublic}, &log)
	for i := 0; i < 100; i++ {
		e.Deny("tcp", "10.0.2.2:80", "gateway")
	}
	e.Deny("tcp", "10.0.2.2:81", "gateway")
	if n := strings.Count(log.String(), "\n"); n != 2 {
		t.Errorf("%d log lines:\n%s", n, log.String())
	}
	if e.Stats().Denied != 101 {
		t.Errorf("denied = %d", e.Stats().Denied)
	}
}

func TestAdmit(t *testing.T) {
	e, _ := NewEngine(Policy{Mode: ModePublic}, nil)
	e.rate = rate.NewLimiter(0.001, 3) // flowRate's refill is too fast to test on a loaded machine
	for i := 0; i < 3; i++ {
		if why := e.admit(); why != "" {
			t.Fatalf("flow %d refused: %s", i, why)
		}
	}
	if why := e.admit(); !strings.Contains(why, "per second") {
		t.Errorf("flow beyond the burst: %q", why)
	}
	e, _ = NewEngine(Policy{Mode: ModePublic}, nil)
	for i := 0; i < maxFlows; i++ {
		e.track(&flow{close: func() {}})
	}
	if why := e.admit(); why != "too many open connections" {
		t.Errorf("flow beyond maxFlows: %q", why)
	}
}

// TestHostileGuestMappedIPv4: an IPv4-mapped IPv6 address (::ffff:a.b.c.d)
// is the IPv4 address to every check. A rule written that way is refused
// with the IPv4 form to write instead (a server's grant check, which reads
// the rule's text, would otherwise see an IPv6 address outside the private
// ranges while the box reaches the IPv4 host), and mapped flow destinations
// and DNS answers meet the IPv4 deny ranges.
func TestHostileGuestMappedIPv4(t *testing.T) {
	for in, want := range map[string]string{
		"::ffff:10.0.0.5":        "write the IPv4 form, 10.0.0.5",
		"[::ffff:10.0.0.5]:22":   "write the IPv4 form, 10.0.0.5",
		"::ffff:10.0.0.0/104":    "write the IPv4 form, 10.0.0.0/8",
		"::ffff:192.168.1.1/128": "write the IPv4 form, 192.168.1.1",
		"::ffff:127.0.0.1":       "write the IPv4 form, 127.0.0.1",
	} {
		if r, err := ParseRule(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRule(%q) = %v, %v; want an error with %q", in, r, err, want)
		}
	}
	if err := (Policy{Mode: ModeAllowlist, Allow: []string{"::ffff:10.0.0.5"}}).Validate(); err == nil {
		t.Error("a policy listing ::ffff:10.0.0.5 is valid")
	}
	pub, _ := NewEngine(Policy{Mode: ModePublic}, nil)
	al, _ := NewEngine(Policy{Mode: ModeAllowlist, Allow: []string{"api.example.com", "0.0.0.0/0:443"}}, nil)
	for _, e := range []*Engine{pub, al} {
		for _, dst := range []string{"[::ffff:10.0.0.5]:443", "[::ffff:127.0.0.1]:443", "[::ffff:169.254.169.254]:80"} {
			if v := e.Check("tcp", ap(dst)); v.Allow {
				t.Errorf("%s: flow to %s allowed", e.Policy().Mode, dst)
			}
		}
		// A DNS answer (an AAAA record, or an A record held as 16 bytes)
		// naming a mapped private address is refused as the IPv4 one.
		for _, a := range []string{"::ffff:10.0.0.5", "::ffff:127.0.0.1", "::ffff:169.254.169.254"} {
			if why := e.Resolved("api.example.com", netip.MustParseAddr(a)); why == "" {
				t.Errorf("%s: answer %s accepted", e.Policy().Mode, a)
			}
		}
	}
}

// TestCheckPublicDeny checks a public policy with Deny (a denylist, E2B's
// deny_out): what Deny covers is refused, on its port when it names one,
// unless an Allow entry (an exception) covers it; the rest of the
// internet stays reachable and the always-denied and private ranges stay
// denied.
func TestCheckPublicDeny(t *testing.T) {
	e, err := NewEngine(Policy{Mode: ModePublic, Deny: []string{"198.51.100.0/24", "203.0.113.9:22"}, Allow: []string{"198.51.100.7"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dst   string
		allow bool
	}{
		{"198.51.100.1:443", false}, // in Deny
		{"198.51.100.7:443", true},  // the exception
		{"198.51.101.1:443", true},  // outside Deny
		{"203.0.113.9:22", false},   // Deny's port
		{"203.0.113.9:443", true},   // another port
		{"10.1.2.3:443", false},     // private: denied in public mode anyway
		{"169.254.169.254:80", false},
	} {
		if v := e.Check("tcp", ap(c.dst)); v.Allow != c.allow {
			t.Errorf("Check(%s) = %+v, want allow %v", c.dst, v, c.allow)
		}
	}
	if !e.NameAllowed("example.com") {
		t.Error("a public policy with Deny must resolve names")
	}
	for _, p := range []Policy{
		{Mode: ModePublic, Deny: []string{"example.com"}},
		{Mode: ModePublic, Deny: []string{"10.0.0.0/8"}, Allow: []string{"api.example.com"}},
		{Mode: ModeAllowlist, Deny: []string{"10.0.0.0/8"}, Allow: []string{"203.0.113.1"}},
		{Mode: ModePublic, Allow: []string{"203.0.113.1"}},
	} {
		if err := p.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", p)
		}
	}
}
