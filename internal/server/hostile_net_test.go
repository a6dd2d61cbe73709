package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
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

// pullProblem runs POST /v1/images/pull and returns the problem of its
// error event (nil when it ended otherwise).
func pullProblem(t *testing.T, base, ref string) *Problem {
	t.Helper()
	resp, err := http.Post(base+"/v1/images/pull", "application/json", strings.NewReader(`{"ref":"`+ref+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var ev, last string
	for sc.Scan() {
		if e, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			ev = e
		}
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			last = d
		}
	}
	if ev != "error" {
		t.Logf("pull %s ended with %s %s", ref, ev, last)
		return nil
	}
	var pe PullError
	json.Unmarshal([]byte(last), &pe)
	return pe.Problem
}

// TestHostileClientPullSSRF: a client cannot make the server fetch from
// its loopback or private networks through an image pull (POST
// /v1/images/pull, or a create whose image is absent) without
// --allow-private-net, by address or by a name that resolves there; with
// the grant, what such a host answers never comes back in the error.
func TestHostileClientPullSSRF(t *testing.T) {
	var hits atomic.Int64
	intranet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte("INTRANET-SECRET " + strings.Repeat("x", 200)))
	}))
	defer intranet.Close()
	host := strings.TrimPrefix(intranet.URL, "http://")
	rt := openRuntime(t)
	ts := httptest.NewServer(New(Config{Runtime: rt}).Handler(false))
	defer ts.Close()

	for _, ref := range []string{host + "/x/y:z", strings.Replace(host, "127.0.0.1", "localhost", 1) + "/x/y:z"} {
		p := pullProblem(t, ts.URL, ref)
		if p == nil || p.Status != 403 || p.Code != CodePolicyDenied || !strings.Contains(p.Detail, "--allow-private-net") {
			t.Errorf("pull %s: %+v, want 403 policy_denied naming --allow-private-net", ref, p)
		}
		st, pr := postBox(t, ts.URL, BoxSpec{Image: ref})
		if st != 403 || pr.Code != CodePolicyDenied || !strings.Contains(pr.Detail, "--allow-private-net") {
			t.Errorf("create from %s: %d %+v, want 403 policy_denied", ref, st, pr)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the loopback service got %d requests", n)
	}

	granted := httptest.NewServer(New(Config{Runtime: rt, Policy: Policy{AllowPrivateNet: true}}).Handler(false))
	defer granted.Close()
	p := pullProblem(t, granted.URL, host+"/x/y:z")
	if p == nil || strings.Contains(p.Detail, "INTRANET-SECRET") || !strings.Contains(p.Detail, "HTTP 400") {
		t.Errorf("pull from a granted loopback service: %+v, want its status and not its body", p)
	}
	if hits.Load() == 0 {
		t.Error("with --allow-private-net the pull did not reach the loopback registry")
	}
}

// TestPullAddrGrants: what checkPullAddr lets a pull connect to, with and
// without --allow-private-net.
func TestPullAddrGrants(t *testing.T) {
	for _, tc := range []struct {
		addr           string
		plain, granted bool
	}{
		{"203.0.113.7", true, true},
		{"2001:db8::1", true, true},
		{"127.0.0.1", false, true},
		{"::1", false, true},
		{"10.1.2.3", false, true},
		{"::ffff:10.1.2.3", false, true},
		{"192.168.1.1", false, true},
		{"100.64.0.1", false, true},
		{"fd00::1", false, true},
		{"169.254.169.254", false, false},
		{"::ffff:169.254.169.254", false, false},
		{"fe80::1", false, false},
		{"0.0.0.0", false, false},
		{"224.0.0.1", false, false},
	} {
		a := netip.MustParseAddr(tc.addr)
		if err := (Policy{}).checkPullAddr("h", a); (err == nil) != tc.plain {
			t.Errorf("%s without the grant: %v", tc.addr, err)
		}
		if err := (Policy{AllowPrivateNet: true}).checkPullAddr("h", a); (err == nil) != tc.granted {
			t.Errorf("%s with --allow-private-net: %v", tc.addr, err)
		}
	}
}

// A request refused for its token is logged as unauthenticated, not as
// the token holder's.
func TestHostileClientWrongTokenLoggedAsUnauthenticated(t *testing.T) {
	var logBuf syncBuffer
	s := New(Config{Runtime: openRuntime(t), Token: "right", Logger: slog.New(slog.NewJSONHandler(&logBuf, nil))})
	ts := httptest.NewServer(s.Handler(true))
	defer ts.Close()
	for _, tok := range []string{"wrong", "right"} {
		req, _ := http.NewRequest("GET", ts.URL+"/v1/boxes", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	clients := map[int]string{}
	for _, line := range strings.Split(strings.TrimSpace(logBuf.String()), "\n") {
		var e struct {
			Path   string `json:"path"`
			Status int    `json:"status"`
			Client string `json:"client"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Path == "/v1/boxes" {
			clients[e.Status] = e.Client
		}
	}
	if clients[http.StatusUnauthorized] != "unauthenticated" || !strings.HasPrefix(clients[http.StatusOK], "token:") {
		t.Fatalf("logged clients by status: %v", clients)
	}
}

// syncBuffer is a bytes.Buffer safe for the server's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
