package server

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHostileClientMappedIPv4: an allow_net entry naming a private IPv4
// host in its IPv4-mapped IPv6 form (::ffff:10.0.0.5), which a box reaches
// as the IPv4 host, needs --allow-private-net like the IPv4 form does.
func TestHostileClientMappedIPv4(t *testing.T) {
	ts := httptest.NewServer(New(Config{Runtime: openRuntime(t)}).Handler(false))
	defer ts.Close()
	for _, e := range []string{"::ffff:10.0.0.5", "[::ffff:192.168.1.5]:22", "::ffff:10.0.0.0/104", "::ffff:172.16.0.1/128"} {
		// The image is on a closed loopback port: a request the check
		// lets through fails there, never reaching another host.
		st, p := postBox(t, ts.URL, BoxSpec{Image: "127.0.0.1:1/x:1", AllowNet: []string{e}})
		if st != 403 || p.Code != CodePolicyDenied || !strings.Contains(p.Detail, "--allow-private-net") {
			t.Errorf("allow_net %q: %d %+v, want 403 policy_denied naming --allow-private-net", e, st, p)
		}
	}
}
