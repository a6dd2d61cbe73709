package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
)

// TestHostileGuestNULOutputBoundedInJSON: output a box printed is what the
// buffered exec returns; a stream of NULs, which JSON writes as \u0000 (6
// bytes each), comes back base64 (4/3), so the response is at most about
// twice the kept output, and the result says what was dropped.
func TestHostileGuestNULOutputBoundedInJSON(t *testing.T) {
	const kept = 16 << 20
	res := resultOf(&airlock.ExecResult{Stdout: make([]byte, kept), Stderr: []byte("a\tb\n"),
		Truncated: true, StdoutDropped: 200e6 - kept})
	body, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) > 2*kept+1024 {
		t.Errorf("%d NULs encode to %d bytes of JSON, want at most %d", kept, len(body), 2*kept+1024)
	}
	var got map[string]any
	json.Unmarshal(body, &got)
	if got["stdout_encoding"] != EncodingBase64 || got["truncated"] != true || got["stdout_dropped"] != float64(200e6-kept) ||
		got["stderr_encoding"] != EncodingUTF8 || got["stderr"] != "a\tb\n" {
		t.Errorf("result %v %v %v %v %v: want stdout base64, truncated, stdout_dropped %d, stderr as text", got["stdout_encoding"], got["truncated"], got["stdout_dropped"], got["stderr_encoding"], got["stderr"], int64(200e6-kept))
	}
	enc, _ := got["stdout"].(string)
	raw, _ := base64.StdEncoding.DecodeString(enc)
	if len(raw) != kept || bytes.IndexFunc(raw, func(r rune) bool { return r != 0 }) >= 0 {
		t.Errorf("stdout decodes to %d bytes, want %d NULs", len(raw), kept)
	}
}

// TestHostileGuestCellOutputClipped: a cell's text (a hostile kernel's
// reply can carry 32 MiB of NULs in each field) is cut to the server's
// JSON budget with a note, and the result says truncated.
func TestHostileGuestCellOutputClipped(t *testing.T) {
	s := New(Config{MaxOutputBytes: 1 << 20})
	nuls := strings.Repeat("\x00", 8<<20)
	r := CellResult{Stdout: nuls, Stderr: "fine", Value: nuls, Error: &CellError{Name: "E", Value: nuls, Traceback: nuls}}
	s.clipCell(&r)
	body, _ := json.Marshal(r)
	if max := 2*s.textLimit() + 3*s.textLimit()/4 + 64<<10; int64(len(body)) > max {
		t.Errorf("cell of 32 MiB of NULs: %d bytes of JSON, want at most %d", len(body), max)
	}
	if !r.Truncated || !strings.Contains(r.Stdout, "bytes left out here") || r.Stderr != "fine" {
		t.Errorf("truncated %v, stdout note %v, stderr %q", r.Truncated, strings.Contains(r.Stdout, "bytes left out here"), r.Stderr)
	}
	run := RunResult{Stdout: nuls, Stderr: "x", Error: nuls}
	s.clipRun(&run)
	if body, _ := json.Marshal(run); int64(len(body)) > 2*s.textLimit()+s.textLimit()/4+64<<10 {
		t.Errorf("code run of NULs: %d bytes of JSON", len(body))
	}
}

// TestHostileClientTimeoutOverflow: a timeout past what a Duration holds
// saturates instead of wrapping to a negative one (which read as none).
func TestHostileClientTimeoutOverflow(t *testing.T) {
	for _, secs := range []float64{1e10, 1e300, 9.3e9} {
		if d := seconds(secs); d < 24*time.Hour*365*100 {
			t.Errorf("seconds(%g) = %v, want about 292 years", secs, d)
		}
		if (&ExecRequest{Timeout: secs}).options().Timeout <= 0 {
			t.Errorf("exec timeout %g s: %v", secs, (&ExecRequest{Timeout: secs}).options().Timeout)
		}
	}
	if seconds(1.5) != 1500*time.Millisecond || seconds(0) != 0 {
		t.Errorf("seconds(1.5) = %v, seconds(0) = %v", seconds(1.5), seconds(0))
	}
}

// openEvents opens /v1/events on base and waits for its first message.
func openEvents(t *testing.T, base string) (*http.Response, error) {
	t.Helper()
	resp, err := http.Get(base + "/v1/events")
	if err != nil || resp.StatusCode != 200 {
		return resp, err
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	for err == nil && !strings.Contains(line, EventStreamOpen) {
		line, err = br.ReadString('\n')
	}
	return resp, err
}

// TestHostileClientEventSubscribersCapped: event streams past
// Config.MaxSubscribers get 503 too_many_subscribers; one closed makes
// room.
func TestHostileClientEventSubscribersCapped(t *testing.T) {
	s := New(Config{Runtime: openRuntime(t), Events: NewEvents(), MaxSubscribers: 2})
	ts := httptest.NewServer(s.Handler(false))
	t.Cleanup(ts.Close) // after the streams below are closed
	var open []*http.Response
	for i := 0; i < 2; i++ {
		resp, err := openEvents(t, ts.URL)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream %d: %v %v", i, resp, err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		open = append(open, resp)
	}
	resp, err := http.Get(ts.URL + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third stream with --max-subscribers 2: %d, want 503", resp.StatusCode)
	}
	if p := decodeProblem(t, resp); p.Code != CodeTooManySubscribers || !strings.Contains(p.Detail, "--max-subscribers") {
		t.Errorf("problem %+v", p)
	}
	open[0].Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := openEvents(t, ts.URL)
		if err == nil && resp.StatusCode == 200 {
			resp.Body.Close()
			break
		}
		if resp != nil {
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no room after a stream closed: %v %v", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	open[1].Body.Close()
}

// TestHostileClientConnectionLimit: past Config.MaxConns connections
// that made a request with the token, a new one is not served until one
// closes; the unix socket has its own count.
func TestHostileClientConnectionLimit(t *testing.T) {
	s := New(Config{Runtime: openRuntime(t), Token: "tok", MaxConns: 2})
	addr := serveTCP(t, s)
	if err := getHealth(addr, "tok", 10*time.Second); err != nil {
		t.Fatalf("health: %v", err)
	}
	var held []net.Conn
	for i := 0; i < 2; i++ {
		c, status := rawRequest(t, addr, "tok")
		if status != 200 {
			t.Fatalf("held connection %d: status %d", i, status)
		}
		defer c.Close()
		held = append(held, c)
	}
	if err := getHealth(addr, "tok", 700*time.Millisecond); err == nil {
		t.Fatal("a third connection was served with --max-conns 2 and two authenticated ones held open")
	}
	held[0].Close()
	// Served once the server has seen the close: a wait, with a deadline.
	if err := getHealth(addr, "tok", 10*time.Second); err != nil {
		t.Fatalf("no connection served within 10 s after one of the two closed: %v", err)
	}
}

// TestHostileClientUnauthenticatedConnsLockNobodyOut: a peer without the
// token that opens many connections, idle or each with a refused request
// kept open, does not hold the --max-conns slots: a client with the token
// is still served at once, a refused connection is closed after its 401,
// and the idle ones beyond MaxUnauthenticatedConns are closed.
func TestHostileClientUnauthenticatedConnsLockNobodyOut(t *testing.T) {
	s := New(Config{Runtime: openRuntime(t), Token: "tok", MaxConns: 2})
	addr := serveTCP(t, s)
	// Refused requests: the connection ends after the 401.
	for i := 0; i < 4; i++ {
		c, status := rawRequest(t, addr, "wrong")
		defer c.Close()
		if status != http.StatusUnauthorized {
			t.Fatalf("status %d without the token, want 401", status)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Fatalf("a connection refused for its token stayed open (read %d, %v)", n, err)
		}
	}
	// Idle connections, many more than both bounds.
	const flood = MaxUnauthenticatedConns + 40
	var idle []net.Conn
	for i := 0; i < flood; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 3; i++ {
		if err := getHealth(addr, "tok", 2*time.Second); err != nil {
			t.Fatalf("a client with the token was not served while %d connections without it were open: %v", flood, err)
		}
	}
	closed := 0
	for _, c := range idle[:flood-MaxUnauthenticatedConns] {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
	}
	if closed != flood-MaxUnauthenticatedConns {
		t.Errorf("%d of the %d oldest idle connections were closed, want all (at most %d wait unauthenticated)", closed, flood-MaxUnauthenticatedConns, MaxUnauthenticatedConns)
	}
}

// serveTCP serves s on a loopback TCP listener until the test ends and
// returns its address.
func serveTCP(t *testing.T, s *Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return l.Addr().String()
}

// getHealth asks for /v1/health with token on a new connection, waiting
// up to d for the answer.
func getHealth(addr, token string, d time.Duration) error {
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/health", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	cl := &http.Client{Timeout: d, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// rawRequest sends one keep-alive GET /v1/health with token on a new
// connection and returns the connection, left open, and the status.
func rawRequest(t *testing.T, addr, token string) (net.Conn, int) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", token)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		t.Fatalf("request: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.SetDeadline(time.Time{})
	return c, resp.StatusCode
}
