package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolicyGrants: host volumes only under --allow-volume directories
// (symlinks resolved first), host ports only those granted, private
// allow_net ranges only with --allow-private-net, named volumes unless
// refused. Every refusal is 403 policy_denied with a reason, before any
// box is created.
func TestPolicyGrants(t *testing.T) {
	root := t.TempDir()
	granted := filepath.Join(root, "granted")
	outside := filepath.Join(root, "outside")
	for _, d := range []string{granted, outside, filepath.Join(granted, "sub")} {
		os.MkdirAll(d, 0o755)
	}
	// A link inside the granted directory that leads out of it.
	os.Symlink(outside, filepath.Join(granted, "escape"))
	rt := openRuntime(t)
	s := New(Config{Runtime: rt, Policy: Policy{AllowVolumeDirs: []string{granted}, AllowHostPorts: []int{8080}, DenyNamedVolumes: true}})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	none := httptest.NewServer(New(Config{Runtime: rt}).Handler(false))
	defer none.Close()

	post := func(base string, spec BoxSpec) (int, Problem) { t.Helper(); return postBox(t, base, spec) }
	vol := func(src string) []VolumeSpec { return []VolumeSpec{{Source: src, Target: "/data"}} }
	for _, tc := range []struct {
		name string
		base string
		spec BoxSpec
		want string // in the detail
	}{
		{"no grant at all", none.URL, BoxSpec{Volumes: vol(granted)}, "--allow-volume"},
		{"outside", ts.URL, BoxSpec{Volumes: vol(outside)}, "not under a directory"},
		{"dotdot", ts.URL, BoxSpec{Volumes: vol(granted + "/../outside")}, "not under a directory"},
		{"symlink out", ts.URL, BoxSpec{Volumes: vol(filepath.Join(granted, "escape"))}, "once symlinks are resolved"},
		{"missing", ts.URL, BoxSpec{Volumes: vol(filepath.Join(granted, "nope"))}, "cannot resolve"},
		{"named refused", ts.URL, BoxSpec{Volumes: vol("cache")}, "named volumes"},
		{"host port", ts.URL, BoxSpec{AllowHostPorts: []int{22}}, "--allow-host-port"},
		{"host port, no grant", none.URL, BoxSpec{AllowHostPorts: []int{8080}}, "--allow-host-port"},
		{"private cidr", ts.URL, BoxSpec{AllowNet: []string{"10.1.0.0/16"}}, "--allow-private-net"},
		{"private ip:port", ts.URL, BoxSpec{AllowNet: []string{"192.168.1.5:22"}}, "--allow-private-net"},
		{"ula", ts.URL, BoxSpec{AllowNet: []string{"[fd00::1]:80"}}, "--allow-private-net"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, p := post(tc.base, tc.spec)
			if st != 403 || p.Code != CodePolicyDenied || !strings.Contains(p.Detail, tc.want) {
				t.Errorf("%d %+v, want 403 policy_denied naming %q", st, p, tc.want)
			}
		})
	}
	// What the policy lets through reaches the library: these fail later
	// (no such image in this empty home), not with 403.
	for _, spec := range []BoxSpec{
		{Image: "nosuch.invalid/x:1", Volumes: []VolumeSpec{{Source: filepath.Join(granted, "sub"), Target: "/data"}}},
		{Image: "nosuch.invalid/x:1", AllowHostPorts: []int{8080}, AllowNet: []string{"example.com", "203.0.113.0/24:443", "0.0.0.0/0"}},
	} {
		if st, p := post(ts.URL, spec); st == 403 {
			t.Errorf("%+v refused: %+v", spec, p)
		}
	}
	// A malformed volume is the client's error (400), not a 500.
	if st, p := post(ts.URL, BoxSpec{Volumes: []VolumeSpec{{Source: "cache!", Target: "/data"}}}); st != 403 && st != 400 {
		t.Errorf("bad volume name: %d %+v", st, p)
	}
	allowNamed := httptest.NewServer(New(Config{Runtime: rt}).Handler(false))
	defer allowNamed.Close()
	if st, p := post(allowNamed.URL, BoxSpec{Volumes: []VolumeSpec{{Source: "cache", Target: "data"}}}); st != 400 || p.Code != CodeInvalid {
		t.Errorf("relative volume target: %d %+v, want 400 invalid_request", st, p)
	}
}

func TestAllowNetPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1": "10.0.0.1/32", "10.0.0.0/8:443": "10.0.0.0/8", "[fd00::1]:80": "fd00::1/128", "fd00::/8": "fd00::/8",
		"203.0.113.7:8080": "203.0.113.7/32", "example.com": "", "*.example.com:443": "",
	} {
		p, ok := allowNetPrefix(in)
		got := ""
		if ok {
			got = p.String()
		}
		if got != want {
			t.Errorf("allowNetPrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

// postBox creates a box through the API at base and returns the status
// and the problem details of the reply.
func postBox(t *testing.T, base string, spec BoxSpec) (int, Problem) {
	t.Helper()
	b, _ := json.Marshal(spec)
	resp, err := http.Post(base+"/v1/boxes", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p Problem
	json.NewDecoder(resp.Body).Decode(&p)
	return resp.StatusCode, p
}
