package netstack

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func TestSecretChecks(t *testing.T) {
	for _, n := range []string{"TOKEN", "_x", "a1", "OPENAI_API_KEY"} {
		if err := CheckSecretName(n); err != nil {
			t.Errorf("CheckSecretName(%q): %v", n, err)
		}
	}
	for _, n := range []string{"", "1A", "A-B", "A B", "A=B", strings.Repeat("A", 129), "PATH", "HOME", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS"} {
		if err := CheckSecretName(n); err == nil {
			t.Errorf("CheckSecretName(%q) accepted", n)
		}
	}
	for _, v := range []string{"", "a\r\nX-Evil: 1", "a\x00", strings.Repeat("v", MaxSecretValue+1)} {
		if err := CheckSecretValue("T", v); err == nil {
			t.Errorf("CheckSecretValue(%q) accepted", v)
		}
	}
	if err := CheckSecretValue("T", "sk-abc/+=."); err != nil {
		t.Error(err)
	}
	good := map[string]string{"API.example.com": "api.example.com", "*.example.com": "*.example.com", "example.com.": "example.com"}
	for in, want := range good {
		if got, err := ParseSecretHost(in); err != nil || got != want {
			t.Errorf("ParseSecretHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, h := range []string{"", "1.2.3.4", "10.0.0.0/8", "api.example.com:443", "a.*.example.com", "*.com", "exa mple.com"} {
		if _, err := ParseSecretHost(h); err == nil {
			t.Errorf("ParseSecretHost(%q) accepted", h)
		}
	}
	match := []struct {
		host, name string
		want       bool
	}{
		{"api.example.com", "api.example.com", true},
		{"api.example.com", "API.Example.com.", true},
		{"api.example.com", "x.api.example.com", false},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "badexample.com", false},
	}
	for _, m := range match {
		if got := MatchSecretHost(m.host, m.name); got != m.want {
			t.Errorf("MatchSecretHost(%q, %q) = %v", m.host, m.name, got)
		}
	}
	ph, _ := NewPlaceholder()
	ok := Secret{Name: "T", Value: "v", Placeholder: ph, Hosts: []string{"a.example"}}
	if err := CheckSecrets([]Secret{ok}); err != nil {
		t.Fatal(err)
	}
	many := make([]Secret, MaxSecrets+1)
	for i := range many {
		many[i] = ok
		many[i].Name = fmt.Sprintf("T%d", i)
	}
	bad := map[string][]Secret{
		"too many":    many,
		"twice":       {ok, ok},
		"no hosts":    {{Name: "T", Value: "v", Placeholder: ph}},
		"placeholder": {{Name: "T", Value: "v", Placeholder: "x", Hosts: []string{"a.example"}}},
		"host":        {{Name: "T", Value: "v", Placeholder: ph, Hosts: []string{"1.2.3.4"}}},
	}
	for what, ss := range bad {
		if err := CheckSecrets(ss); err == nil {
			t.Errorf("CheckSecrets accepted %s", what)
		}
	}
	if p2, _ := NewPlaceholder(); p2 == ph || !strings.HasPrefix(p2, PlaceholderPrefix) || len(p2) != len(PlaceholderPrefix)+32 {
		t.Errorf("placeholders %q, %q", ph, p2)
	}
}

func TestSubstitute(t *testing.T) {
	s := []Secret{{Name: "A", Value: "va", Placeholder: "airlock-secret-aaaa"}, {Name: "B", Value: "vb", Placeholder: "airlock-secret-bbbb"}}
	h := http.Header{
		"Authorization": {"Bearer airlock-secret-aaaa"},
		"X-Both":        {"airlock-secret-bbbb:airlock-secret-aaaa", "none"},
		"X-Other":       {"airlock-secret-cccc"},
	}
	used := substitute(h, s)
	if fmt.Sprint(used) != "[A B]" {
		t.Errorf("used %v", used)
	}
	if h.Get("Authorization") != "Bearer va" || h["X-Both"][0] != "vb:va" || h["X-Both"][1] != "none" || h.Get("X-Other") != "airlock-secret-cccc" {
		t.Errorf("headers after: %v", h)
	}
	if used := substitute(http.Header{"X": {"nothing"}}, s); used != nil {
		t.Errorf("used %v with no placeholder", used)
	}
}

func TestBoxCALeaf(t *testing.T) {
	certPEM, keyPEM, err := NewCA("airlock box test")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(certPEM, []byte("PRIVATE")) {
		t.Fatal("CA certificate PEM holds a key")
	}
	ph, _ := NewPlaceholder()
	e, _ := NewEngine(Policy{Mode: ModePublic}, nil)
	ic, err := newInterceptor(e, SecretConfig{Secrets: []Secret{{Name: "T", Value: "v", Placeholder: ph, Hosts: []string{"*.example.com"}}},
		CACert: certPEM, CAKey: keyPEM}, "")
	if err != nil {
		t.Fatal(err)
	}
	c1, err := ic.leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if c2, _ := ic.leaf("api.example.com"); c2 != c1 {
		t.Error("leaf not cached")
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	if _, err := c1.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool}); err != nil {
		t.Errorf("leaf does not verify against the box CA: %v", err)
	}
	if _, err := c1.Leaf.Verify(x509.VerifyOptions{DNSName: "other.example.com", Roots: pool}); err == nil {
		t.Error("leaf verifies for another name")
	}
	// A key of another CA is refused.
	_, otherKey, _ := NewCA("other")
	if _, err := newInterceptor(e, SecretConfig{Secrets: []Secret{{Name: "T", Value: "v", Placeholder: ph, Hosts: []string{"a.example"}}},
		CACert: certPEM, CAKey: otherKey}, ""); err == nil {
		t.Error("mismatched CA key accepted")
	}
}

func TestEngineBoundNames(t *testing.T) {
	e, _ := NewEngine(Policy{Mode: ModePublic}, nil)
	e.bound = func(n string) bool { return n == "api.example.com" }
	a := netip.MustParseAddr("8.8.8.8")
	if why := e.Resolved("api.example.com", a); why != "" {
		t.Fatal(why)
	}
	e.Resolved("www.example.com", a)
	if got := e.BoundNames(a); fmt.Sprint(got) != "[api.example.com]" {
		t.Errorf("BoundNames = %v", got)
	}
	if got := e.BoundNames(netip.MustParseAddr("8.8.4.4")); got != nil {
		t.Errorf("BoundNames of an unresolved address = %v", got)
	}
}

// interceptHarness is an upstream HTTPS server (its own CA, trusted
// through the extra-CA file) and an interceptor for box secrets bound to
// example.com (the name in httptest's certificate).
type interceptHarness struct {
	srv     *httptest.Server
	ic      *interceptor
	boxCA   *x509.CertPool
	secret  Secret
	upAddr  netip.AddrPort
	logMu   sync.Mutex
	logBuf  bytes.Buffer
	extraCA string
}

func (h *interceptHarness) Write(p []byte) (int, error) {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return h.logBuf.Write(p)
}

func (h *interceptHarness) log() string {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return h.logBuf.String()
}

func newInterceptHarness(t testing.TB, handler http.Handler, trustUpstream bool) *interceptHarness {
	t.Helper()
	srv := httptest.NewUnstartedServer(handler)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	h := &interceptHarness{srv: srv}
	if trustUpstream {
		h.extraCA = filepath.Join(t.TempDir(), "ca.pem")
		os.WriteFile(h.extraCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	}
	certPEM, keyPEM, err := NewCA("airlock box test")
	if err != nil {
		t.Fatal(err)
	}
	ph, _ := NewPlaceholder()
	h.secret = Secret{Name: "TOKEN", Value: "the-real-value", Placeholder: ph, Hosts: []string{"example.com"}}
	e, _ := NewEngine(Policy{Mode: ModePublic}, h)
	if h.ic, err = newInterceptor(e, SecretConfig{Secrets: []Secret{h.secret}, CACert: certPEM, CAKey: keyPEM}, h.extraCA); err != nil {
		t.Fatal(err)
	}
	h.boxCA = x509.NewCertPool()
	h.boxCA.AppendCertsFromPEM(certPEM)
	h.upAddr = netip.MustParseAddrPort(srv.Listener.Addr().String())
	return h
}

// boxClient is an HTTP client whose connections go through the
// interceptor as the box's would, trusting roots.
func (h *interceptHarness) boxClient(t testing.TB, roots *x509.CertPool, h2 bool) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		box, in := net.Pipe()
		out, err := net.Dial("tcp", h.upAddr.String())
		if err != nil {
			return nil, err
		}
		go h.ic.handle(in, out, h.upAddr, []string{"example.com"})
		return box, nil
	}
	tr := &http.Transport{DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: h2}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func echoHeaders(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "proto=%s\nauthorization=%s\n", r.Proto, r.Header.Get("Authorization"))
	io.Copy(w, r.Body)
}

func TestInterceptSubstitutes(t *testing.T) {
	h := newInterceptHarness(t, http.HandlerFunc(echoHeaders), true)
	h.ic.dial = func(a netip.AddrPort) (net.Conn, error) { return net.Dial("tcp", a.String()) }
	for _, h2 := range []bool{false, true} {
		c := h.boxClient(t, h.boxCA, h2)
		for i := 0; i < 2; i++ { // keep-alive: two requests on one connection
			req, _ := http.NewRequest("POST", "https://example.com/x?k="+h.secret.Placeholder, strings.NewReader("body "+h.secret.Placeholder))
			req.Header.Set("Authorization", "Bearer "+h.secret.Placeholder)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("h2=%v: %v", h2, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := "authorization=Bearer the-real-value\nbody " + h.secret.Placeholder
			if !strings.Contains(string(body), want) {
				t.Errorf("h2=%v: upstream saw %q, want %q (the value in the header, the placeholder in the body)", h2, body, want)
			}
			if wantProto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]; !strings.Contains(string(body), "proto="+wantProto) || resp.Proto != wantProto {
				t.Errorf("h2=%v: protocols: box %s, upstream %q", h2, resp.Proto, body)
			}
		}
	}
	if l := h.log(); !strings.Contains(l, "https example.com secret TOKEN substituted") || strings.Contains(l, "the-real-value") {
		t.Errorf("network log: %q", l)
	}
	// A new value applies to the next request, on the same connection.
	c := h.boxClient(t, h.boxCA, false)
	for i, v := range []string{"the-real-value", "rotated-value"} {
		if i == 1 {
			if err := h.ic.setValue("TOKEN", v); err != nil {
				t.Fatal(err)
			}
		}
		req, _ := http.NewRequest("GET", "https://example.com/", nil)
		req.Header.Set("Authorization", "Bearer "+h.secret.Placeholder)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "authorization=Bearer "+v+"\n") {
			t.Errorf("request %d: upstream saw %q, want the value %q", i, body, v)
		}
	}
	if h.ic.setValue("NOSUCH", "v") == nil || h.ic.setValue("TOKEN", "a\nb") == nil {
		t.Error("setValue accepted an unknown secret or a bad value")
	}
}

func TestInterceptStreams(t *testing.T) {
	release := make(chan struct{})
	h := newInterceptHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "first")
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprintln(w, "second")
	}), true)
	defer close(release)
	resp, err := h.boxClient(t, h.boxCA, false).Get("https://example.com/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line := make([]byte, 6)
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(resp.Body, line); done <- err }()
	select {
	case err := <-done:
		if err != nil || string(line) != "first\n" {
			t.Fatalf("read %q, %v", line, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first part of a streamed response did not arrive before the response ended (buffered)")
	}
}

func TestInterceptRefusesUnverifiedUpstream(t *testing.T) {
	h := newInterceptHarness(t, http.HandlerFunc(echoHeaders), false)
	_, err := h.boxClient(t, h.boxCA, false).Get("https://example.com/")
	if err == nil {
		t.Fatal("a request to an upstream with an untrusted certificate succeeded")
	}
	if l := h.log(); !strings.Contains(l, "tls example.com denied: real host not verified") {
		t.Errorf("network log: %q", l)
	}
}

func TestInterceptPassesOtherNames(t *testing.T) {
	h := newInterceptHarness(t, http.HandlerFunc(echoHeaders), true)
	// SNI "other.example" is no name bound here: the box talks to the
	// real server and sees its certificate (httptest's, valid for
	// 127.0.0.1), and the placeholder leaves unchanged.
	upPool := x509.NewCertPool()
	upPool.AddCert(h.srv.Certificate())
	c := h.boxClient(t, upPool, false)
	c.Transport.(*http.Transport).TLSClientConfig.ServerName = "other.example"
	c.Transport.(*http.Transport).TLSClientConfig.InsecureSkipVerify = true
	req, _ := http.NewRequest("GET", "https://other.example/", nil)
	req.Header.Set("Authorization", "Bearer "+h.secret.Placeholder)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "authorization=Bearer "+h.secret.Placeholder) {
		t.Errorf("upstream saw %q", body)
	}
	if !resp.TLS.PeerCertificates[0].Equal(h.srv.Certificate()) {
		t.Error("the box did not see the real host's certificate")
	}
}

func TestInterceptWebSocket(t *testing.T) {
	h := newInterceptHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		c.Write(ctx, websocket.MessageText, []byte("auth="+r.Header.Get("Authorization")))
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			c.Write(ctx, typ, append([]byte("echo "), msg...))
		}
	}), true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr := http.Header{"Authorization": {"Bearer " + h.secret.Placeholder}}
	c, _, err := websocket.Dial(ctx, "wss://example.com/ws", &websocket.DialOptions{HTTPClient: h.boxClient(t, h.boxCA, false), HTTPHeader: hdr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	_, msg, err := c.Read(ctx)
	if err != nil || string(msg) != "auth=Bearer the-real-value" {
		t.Fatalf("first message %q, %v", msg, err)
	}
	for _, m := range []string{"one", "two " + h.secret.Placeholder} {
		if err := c.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			t.Fatal(err)
		}
		_, got, err := c.Read(ctx)
		if err != nil || string(got) != "echo "+m {
			t.Fatalf("echo of %q: %q, %v (messages pass unchanged)", m, got, err)
		}
	}
}

// BenchmarkIntercept compares a request on a new HTTPS connection made
// directly to the server with one made through the interception (two
// handshakes, a leaf from the cache, the proxy), on loopback:
//
//	go test -run '^$' -bench BenchmarkIntercept ./internal/netstack
func BenchmarkIntercept(b *testing.B) {
	h := newInterceptHarness(b, http.HandlerFunc(echoHeaders), true)
	upPool := x509.NewCertPool()
	upPool.AddCert(h.srv.Certificate())
	get := func(b *testing.B, c *http.Client) {
		req, _ := http.NewRequest("GET", "https://example.com/", nil)
		req.Header.Set("Authorization", "Bearer "+h.secret.Placeholder)
		req.Close = true // a new connection each time, as a box's one-off request
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: upPool, ServerName: "example.com"},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return net.Dial("tcp", h.upAddr.String()) }}
	direct := &http.Client{Transport: tr}
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			get(b, direct)
		}
	})
	b.Run("intercepted", func(b *testing.B) {
		c := h.boxClient(b, h.boxCA, false)
		for b.Loop() {
			get(b, c)
		}
	})
	// added: 20 requests each way, alternated so that load drifting during
	// the run hits both alike; the medians and the latency the
	// interception adds (-benchtime=1x gives one run's figures).
	b.Run("added", func(b *testing.B) {
		c := h.boxClient(b, h.boxCA, false)
		ms := func(d []time.Duration) float64 {
			slices.Sort(d)
			return float64(d[len(d)/2]) / float64(time.Millisecond)
		}
		for b.Loop() {
			var dd, di []time.Duration
			for range 20 {
				t0 := time.Now()
				get(b, direct)
				dd = append(dd, time.Since(t0))
				t0 = time.Now()
				get(b, c)
				di = append(di, time.Since(t0))
			}
			md, mi := ms(dd), ms(di)
			b.ReportMetric(md, "direct-median-ms")
			b.ReportMetric(mi, "intercepted-median-ms")
			b.ReportMetric(mi-md, "added-ms")
		}
	})
}
