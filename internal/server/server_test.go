package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/airlock-run/airlock"
)

// TestOpenAPICommitted fails when api/openapi.json is not what the Go
// types generate. Regenerate with AIRLOCK_UPDATE=1 go test ./internal/server
// -run TestOpenAPICommitted, or airlock serve --print-openapi > api/openapi.json.
func TestOpenAPICommitted(t *testing.T) {
	spec, err := OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	spec = append(spec, '\n')
	path := filepath.Join("..", "..", "api", "openapi.json")
	if os.Getenv("AIRLOCK_UPDATE") == "1" {
		if err := os.WriteFile(path, spec, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	committed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, spec) {
		t.Fatalf("api/openapi.json is stale: regenerate it with `go run ./cmd/airlock serve --print-openapi > api/openapi.json` (or AIRLOCK_UPDATE=1 go test ./internal/server -run TestOpenAPICommitted)")
	}
}

// TestOpenAPIValid validates the document with kin-openapi, and checks the
// operations the SDKs rely on are in it.
func TestOpenAPIValid(t *testing.T) {
	spec, err := OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("OpenAPI document invalid: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Errorf("openapi = %q, want 3.1.x", doc.OpenAPI)
	}
	for _, p := range []string{"/v1/boxes", "/v1/boxes/{id}", "/v1/boxes/{id}/exec", "/v1/boxes/{id}/exec/ws",
		"/v1/boxes/{id}/code/run", "/v1/boxes/{id}/contexts/{ctx}/run", "/v1/images", "/v1/health", "/v1/version",
		"/v1/boxes/{id}/files", "/v1/boxes/{id}/archive", "/v1/boxes/{id}/files/stat", "/v1/boxes/{id}/files/list", "/v1/boxes/{id}/files/mkdir"} {
		if doc.Paths.Find(p) == nil {
			t.Errorf("path %s missing from the document", p)
		}
	}
	if doc.Components.Schemas["Problem"] == nil {
		t.Error("Problem schema missing")
	}
	if f := doc.Paths.Find("/v1/boxes/{id}/files"); f == nil || f.Get == nil || f.Put == nil || f.Delete == nil {
		t.Error("files: GET (download), PUT (upload) and DELETE (remove) must all be documented")
	}
	if a := doc.Paths.Find("/v1/boxes/{id}/archive"); a == nil || a.Get == nil || a.Put == nil ||
		a.Put.RequestBody.Value.Content.Get("application/x-tar") == nil {
		t.Error("archive: GET and PUT (application/x-tar) must be documented")
	}
}

func openRuntime(t *testing.T) *airlock.Runtime {
	t.Helper()
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

func decodeProblem(t *testing.T, resp *http.Response) Problem {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	var p Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTokenRequired(t *testing.T) {
	s := New(Config{Runtime: openRuntime(t), Token: "s3cret"})
	ts := httptest.NewServer(s.Handler(true))
	defer ts.Close()
	for _, tc := range []struct {
		name, auth string
		want       int
	}{
		{"none", "", 401},
		{"wrong", "Bearer nope", 401},
		{"not bearer", "Basic s3cret", 401},
		{"right", "Bearer s3cret", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/v1/health", "/v1/boxes", "/openapi.json"} {
				req, _ := http.NewRequest("GET", ts.URL+path, nil)
				if tc.auth != "" {
					req.Header.Set("Authorization", tc.auth)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != tc.want {
					t.Errorf("%s: status %d, want %d", path, resp.StatusCode, tc.want)
				}
				if tc.want == 401 {
					if p := decodeProblem(t, resp); p.Code != CodeUnauthorized {
						t.Errorf("code %q, want %q", p.Code, CodeUnauthorized)
					}
				}
				resp.Body.Close()
			}
		})
	}
	// An empty configured token refuses everything rather than accepting
	// "Bearer ".
	s2 := New(Config{Runtime: openRuntime(t)})
	ts2 := httptest.NewServer(s2.Handler(true))
	defer ts2.Close()
	req, _ := http.NewRequest("GET", ts2.URL+"/v1/health", nil)
	req.Header.Set("Authorization", "Bearer ")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("empty token: status %d, want 401", resp.StatusCode)
	}
}

func TestLoadTokenGenerated(t *testing.T) {
	t.Setenv("AIRLOCK_TOKEN", "")
	home := t.TempDir()
	tok, path, err := LoadToken(home, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(tok) != 64 || path != filepath.Join(home, TokenName) {
		t.Fatalf("token %q at %q", tok, path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	again, _, _ := LoadToken(home, "")
	if again != tok {
		t.Errorf("second load gave a different token")
	}
	t.Setenv("AIRLOCK_TOKEN", "fromenv")
	if env, _, _ := LoadToken(home, ""); env != "fromenv" {
		t.Errorf("AIRLOCK_TOKEN ignored: got %q", env)
	}
	if ex, _, _ := LoadToken(home, "explicit"); ex != "explicit" {
		t.Errorf("explicit token ignored: got %q", ex)
	}
}

// TestUnixSocket serves over a real unix socket: owner-only mode, no token
// needed, a second server on the same path refused, a stale file replaced.
func TestUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "airlock-sock-") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, SocketName)
	l, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	if _, err := ListenUnix(path); err == nil || !strings.Contains(err.Error(), "another airlock server") {
		t.Errorf("second ListenUnix: %v, want 'another airlock server'", err)
	}
	s := New(Config{Runtime: openRuntime(t), Token: "unused-on-unix"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	resp, err := c.Get("http://airlock/v1/boxes")
	if err != nil {
		t.Fatal(err)
	}
	var list BoxList
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if resp.StatusCode != 200 || list.Boxes == nil || len(list.Boxes) != 0 {
		t.Errorf("GET /v1/boxes: %d %+v, want 200 and an empty list", resp.StatusCode, list)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id header")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	// The listener closed the socket; a stale file is replaced.
	os.WriteFile(path, nil, 0o600)
	l2, err := ListenUnix(path)
	if err != nil {
		t.Fatalf("stale socket file not replaced: %v", err)
	}
	l2.Close()
}

func TestProblems(t *testing.T) {
	// The grant lets the pull from localhost:1 below fail as unreachable.
	s := New(Config{Runtime: openRuntime(t), MaxBodyBytes: 2 << 20, Policy: Policy{AllowPrivateNet: true}})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"GET", "/v1/boxes/nosuchbox", "", 404, CodeBoxNotFound},
		{"POST", "/v1/boxes/nosuchbox/exec", `{"cmd":["true"]}`, 404, CodeBoxNotFound},
		{"POST", "/v1/boxes/nosuchbox/stop", "", 404, CodeBoxNotFound},
		{"DELETE", "/v1/boxes/nosuchbox", "", 404, CodeBoxNotFound},
		{"POST", "/v1/boxes/nosuchbox/contexts/x/run", `{"code":"1"}`, 404, CodeBoxNotFound},
		{"POST", "/v1/boxes", `{"image":"localhost:1/nope:latest"}`, 404, CodeImageNotFound},
		{"POST", "/v1/boxes", `{"cpus":-1}`, 400, CodeInvalid},
		{"POST", "/v1/boxes", `{"network":"bridged"}`, 400, CodeInvalid},
		{"POST", "/v1/boxes", `{"image":"` + strings.Repeat("x", 3<<20) + `"}`, 413, CodeBodyTooLarge},
		{"GET", "/v1/nothing", "", 404, ""},
		{"GET", "/v1/boxes/nosuchbox/export", "", 404, CodeBoxNotFound},
		{"GET", "/v1/boxes/nosuchbox/export?checkpoints=maybe", "", 400, CodeInvalid},
		{"POST", "/v1/boxes/import", "not a tar archive", 400, CodeInvalid},
		{"POST", "/v1/boxes/import?name=" + strings.Repeat("n", 200), "", 400, CodeInvalid},
		// Under the server's limit but over huma's default of 1 MiB: the
		// body is read (and the box then looked up).
		{"POST", "/v1/boxes/nosuchbox/exec", `{"cmd":["cat"],"stdin":"` + strings.Repeat("x", 1<<20+10) + `"}`, 404, CodeBoxNotFound},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, ts.URL+tc.path, strings.NewReader(tc.body))
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.code == "" {
				return
			}
			p := decodeProblem(t, resp)
			if p.Code != tc.code || p.Status != tc.status || p.Detail == "" {
				t.Errorf("problem %+v, want code %s", p, tc.code)
			}
		})
	}
}

func TestPolicy(t *testing.T) {
	s := New(Config{Runtime: openRuntime(t), Policy: Policy{MaxCPUs: 2, MaxMemoryMiB: 1024, MaxBoxes: 1}})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	for _, body := range []string{`{"cpus":3}`, `{"memory_mib":2048}`} {
		resp, err := http.Post(ts.URL+"/v1/boxes", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		p := decodeProblem(t, resp)
		resp.Body.Close()
		if resp.StatusCode != 403 || p.Code != CodePolicyDenied || !strings.Contains(p.Detail, "at most") {
			t.Errorf("%s: %d %+v, want 403 policy_denied", body, resp.StatusCode, p)
		}
	}
}

func TestProblemMapping(t *testing.T) {
	died := &airlock.DiedError{BoxID: "abc", Cause: "guest kernel panic"}
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("x: %w", airlock.ErrBoxNotFound), 404, CodeBoxNotFound},
		{fmt.Errorf("x: %w", airlock.ErrImageNotFound), 404, CodeImageNotFound},
		{fmt.Errorf("x: %w", airlock.ErrBoxNotRunning), 409, CodeBoxNotRunning},
		{fmt.Errorf("x: %w", airlock.ErrBoxRunning), 409, CodeBoxRunning},
		{fmt.Errorf("x: %w", airlock.ErrNameInUse), 409, CodeNameInUse},
		{fmt.Errorf("exec: %w", died), 502, CodeBoxDied},
		{fmt.Errorf("x: %w", airlock.ErrCheckpointNotFound), 404, CodeCheckpointNotFound},
		{fmt.Errorf("x: %w", airlock.ErrCheckpointExists), 409, CodeCheckpointExists},
		{fmt.Errorf("x: %w", airlock.ErrRolledBack), 409, CodeRolledBack},
		{context.DeadlineExceeded, 504, CodeTimeout},
		{errors.New("disk on fire"), 500, CodeInternal},
	} {
		p := problem(tc.err).(*Problem)
		if p.Status != tc.status || p.Code != tc.code {
			t.Errorf("%v: %d %s, want %d %s", tc.err, p.Status, p.Code, tc.status, tc.code)
		}
		if tc.code == CodeBoxDied && p.Cause != "guest kernel panic" {
			t.Errorf("box died: cause %q", p.Cause)
		}
	}
}

func TestMetricsFamilies(t *testing.T) {
	rt := openRuntime(t)
	m := NewMetrics("v-test")
	m.SetRuntime(rt)
	s := New(Config{Runtime: rt, Metrics: m})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	http.Get(ts.URL + "/v1/health")
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`airlock_build_info{goversion="`, `version="v-test"} 1`,
		`airlock_boxes{state="running"} 0`,
		`airlock_box_starts_total{result="ok"} 0`,
		`airlock_box_start_seconds_bucket`,
		`airlock_execs_total{result="ok"} 0`,
		`airlock_exec_seconds_bucket`,
		`airlock_exec_output_bytes_total 0`,
		`airlock_http_requests_total{method="GET",route="GET /v1/health",status="200"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "# TYPE ") {
			name := strings.Fields(line)[2]
			if !strings.HasPrefix(name, "airlock_") {
				t.Errorf("family %s is not prefixed airlock_", name)
			}
		}
	}
}

func TestIdleExit(t *testing.T) {
	s := New(Config{Runtime: openRuntime(t), IdleExit: 300 * time.Millisecond})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	t0 := time.Now() // before Serve: the idle time counts from Serve's start
	go func() { done <- s.Serve(context.Background(), l) }()
	select {
	case <-done:
		if d := time.Since(t0); d < 300*time.Millisecond {
			t.Errorf("exited after %v, before the idle time", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("idle server did not exit")
	}
}

func TestAuditLogBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	a, err := OpenAuditLog(path, 4096)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		a.Write(AuditEntry{Kind: "exec", BoxID: "b", Cmd: []string{"echo", strings.Repeat("x", 10000)}, ExitCode: intp(i)})
	}
	a.Close()
	var total int64
	for _, p := range []string{path, path + ".1"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", p, fi.Mode().Perm())
		}
		// One entry may overshoot: a line is never split.
		if fi.Size() > 4096+maxAuditField*2+512 {
			t.Errorf("%s is %d bytes, over the bound", p, fi.Size())
		}
		total += fi.Size()
	}
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var last AuditEntry
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	if last.ExitCode == nil || *last.ExitCode != 199 || len(last.Cmd[1]) > maxAuditField+4 {
		t.Errorf("last entry %+v", last)
	}
	if _, err := os.Stat(path + ".2"); err == nil {
		t.Error("more than one rotated file kept")
	}
}

// TestPullImage pulls from a real registry on loopback (go-containerregistry's
// in-memory registry) and reads the progress stream.
func TestPullImage(t *testing.T) {
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	img, err := random.Image(256<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.TrimPrefix(reg.URL, "http://") + "/test/pulled:v1"
	if err := crane.Push(img, ref); err != nil {
		t.Fatal(err)
	}
	// The registry is on loopback, which pulls reach only with this grant.
	s := New(Config{Runtime: openRuntime(t), Policy: Policy{AllowPrivateNet: true}})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	pull := func(ref string) (events []string, last string) {
		resp, err := http.Post(ts.URL+"/v1/images/pull", "application/json", strings.NewReader(`{"ref":"`+ref+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
				events = append(events, ev)
			}
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				last = d
			}
		}
		return events, last
	}
	events, last := pull(ref)
	if len(events) < 3 || events[len(events)-1] != "done" || !strings.Contains(strings.Join(events, ","), "progress") {
		t.Fatalf("events %v, last %s", events, last)
	}
	var done PullDone
	json.Unmarshal([]byte(last), &done)
	if done.Image.Ref != ref || !strings.HasPrefix(done.Image.Digest, "sha256:") {
		t.Errorf("done %+v", done)
	}
	resp, _ := http.Get(ts.URL + "/v1/images")
	var list ImageList
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Images) != 1 || list.Images[0].Ref != ref {
		t.Errorf("images after pull: %+v", list)
	}
	events, last = pull(strings.TrimPrefix(reg.URL, "http://") + "/test/absent:v1")
	var pe PullError
	json.Unmarshal([]byte(last), &pe)
	if len(events) != 1 || events[0] != "error" || pe.Problem == nil || pe.Problem.Code != CodeImageNotFound {
		t.Errorf("pull of a missing image: %v %s", events, last)
	}
}

// An unknown path (404) and a wrong method (405, with Allow) answer with
// problems like every other error, not ServeMux's plain text.
func TestUnroutedAreProblems(t *testing.T) {
	s := New(Config{Runtime: openRuntime(t)})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v1/nope", 404, CodeNotFound},
		{"GET", "/", 404, CodeNotFound},
		{"DELETE", "/v1/health", 405, CodeMethodNotAllowed},
		{"PATCH", "/v1/boxes", 405, CodeMethodNotAllowed},
	} {
		req, _ := http.NewRequest(tc.method, ts.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		p := decodeProblem(t, resp)
		resp.Body.Close()
		if resp.StatusCode != tc.status || p.Status != tc.status || p.Code != tc.code || p.Detail == "" {
			t.Errorf("%s %s: %d %+v, want %d with code %s and a detail", tc.method, tc.path, resp.StatusCode, p, tc.status, tc.code)
		}
		if tc.status == 405 && (resp.Header.Get("Allow") == "" || !strings.Contains(p.Detail, resp.Header.Get("Allow"))) {
			t.Errorf("%s %s: Allow %q, detail %q: want the methods it takes in both", tc.method, tc.path, resp.Header.Get("Allow"), p.Detail)
		}
	}
	// A routed request is untouched.
	resp, err := http.Get(ts.URL + "/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /v1/health: %d", resp.StatusCode)
	}
}

// env is a list of KEY=value or an object; the server's validation takes
// both and refuses what is neither, naming the field.
func TestEnvListOrObject(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: `["A=1","B=2"]`, want: []string{"A=1", "B=2"}},
		{in: `{"B":"2","A":"x=y"}`, want: []string{"A=x=y", "B=2"}},
		{in: `{"A=B":"1"}`, bad: true},
		{in: `{"":"1"}`, bad: true},
		{in: `"A=1"`, bad: true},
	} {
		var e EnvList
		err := json.Unmarshal([]byte(tc.in), &e)
		if tc.bad != (err != nil) || !tc.bad && strings.Join(e, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: %q %v", tc.in, e, err)
		}
	}
	s := New(Config{Runtime: openRuntime(t)})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	for _, body := range []string{`{"env":{"A":1}}`, `{"env":"A=1"}`} {
		resp, err := http.Post(ts.URL+"/v1/boxes", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		p := decodeProblem(t, resp)
		resp.Body.Close()
		if resp.StatusCode != 400 || p.Code != CodeInvalid || len(p.Errors) == 0 || !strings.HasPrefix(p.Errors[0].Pointer, "/env") {
			t.Errorf("create with %s: %d %+v, want invalid_request naming env", body, resp.StatusCode, p)
		}
	}
}

// A server that stops after another bound its socket path (the CLI's
// listenReplacing: the new server takes the path once the old one stops
// accepting, and the old one's listener closes after) leaves the new
// server's socket in place.
func TestUnixCloseKeepsAReplacingServersSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "airlock-sock-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, SocketName)
	old, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	// The old server no longer accepts: its path is a stale socket to the
	// new one, which replaces it.
	old.(*unixListener).UnixListener.Close()
	l, err := ListenUnix(path)
	if err != nil {
		t.Fatalf("replacing a stopped server: %v", err)
	}
	defer l.Close()
	old.Close()
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		t.Fatalf("the replacing server's socket after the old listener closed: %v", err)
	}
	c.Close()
}

// TestValidationErrorsPointAtFields: every request the API refuses as
// invalid is 400 application/problem+json (never huma's 422) whose errors
// name each bad field: a JSON pointer into the body (RFC 6901), or the
// parameter by name, with what is wrong, and never the value sent.
func TestValidationErrorsPointAtFields(t *testing.T) {
	s := New(Config{Runtime: openRuntime(t)})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	type want struct{ pointer, parameter, message string }
	for _, tc := range []struct {
		method, path, body string
		want               []want
	}{
		{"POST", "/v1/boxes", `{"memory_mib":"512"}`, []want{{pointer: "/memory_mib", message: "integer"}}},
		{"POST", "/v1/boxes", `{"memory_mib":-5,"cpus":100}`, []want{{pointer: "/cpus", message: "64"}, {pointer: "/memory_mib", message: ">= 0"}}},
		// Under the library's minimum: the handler's check, not the schema's.
		{"POST", "/v1/boxes", `{"memory_mib":8,"disk_size_mib":1}`, []want{{pointer: "/memory_mib", message: "at least 64"}, {pointer: "/disk_size_mib", message: "at least 16"}}},
		{"POST", "/v1/boxes", `{"env":["A=1",5]}`, []want{{pointer: "/env/1", message: "KEY=value"}}},
		// BoxLite's (key, value) pairs, as a naive client sends them.
		{"POST", "/v1/boxes", `{"env":[["USER","alice"]]}`, []want{{pointer: "/env/0", message: "[key, value] pair"}}},
		{"POST", "/v1/boxes", `{"env":{"A":"1","B":2}}`, []want{{pointer: "/env/B", message: "string"}}},
		{"POST", "/v1/boxes", `{"env":"A=1"}`, []want{{pointer: "/env", message: `{"KEY": "value"}`}}},
		{"POST", "/v1/boxes", `{"env":{"A=B":"1"}}`, []want{{pointer: "/env/A=B", message: "'='"}}},
		{"POST", "/v1/boxes", `{"volumes":[{"source":"","target":"/data"}]}`, []want{{pointer: "/volumes/0/source", message: "length"}}},
		{"POST", "/v1/boxes", `{"labels":{"a/b~c":5}}`, []want{{pointer: "/labels/a~1b~0c", message: "string"}}},
		{"POST", "/v1/boxes", `{"labels":{"k":"v\u0001"}}`, []want{{pointer: "/labels/k", message: "k"}}},
		{"POST", "/v1/boxes", `{"idle_action":"stop"}`, []want{{pointer: "/idle_action", message: "idle_timeout"}}},
		{"POST", "/v1/boxes", `{"bogus":1}`, []want{{pointer: "/bogus", message: "unexpected property"}}},
		{"POST", "/v1/boxes/x/exec", `{"cmd":[""]}`, []want{{pointer: "/cmd/0", message: "command"}}},
		{"POST", "/v1/boxes/x/exec", `{"cmd":null}`, []want{{pointer: "/cmd", message: "command"}}},
		{"POST", "/v1/boxes/x/exec", `{"cmd":["a"],"timeout":"x"}`, []want{{pointer: "/timeout", message: "number"}}},
		{"GET", "/v1/events?since=abc", ``, []want{{parameter: "since", message: "pattern"}}},
		{"GET", "/v1/boxes?label==v", ``, []want{{parameter: "label", message: "KEY=VALUE"}}},
		{"GET", "/v1/boxes/" + strings.Repeat("x", 200), ``, []want{{parameter: "id", message: "128"}}},
	} {
		req, _ := http.NewRequest(tc.method, ts.URL+tc.path, strings.NewReader(tc.body))
		if tc.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		p := decodeProblem(t, resp)
		resp.Body.Close()
		name := tc.method + " " + tc.path + " " + tc.body
		if resp.StatusCode != 400 || p.Status != 400 || p.Code != CodeInvalid || p.Title != "Bad Request" {
			t.Errorf("%s: %d %+v, want 400 invalid_request", name, resp.StatusCode, p)
			continue
		}
		if len(p.Errors) != len(tc.want) {
			t.Errorf("%s: errors %s, want %d", name, dumpErrors(p.Errors), len(tc.want))
			continue
		}
		for i, w := range tc.want {
			e := p.Errors[i]
			if e.Pointer != w.pointer || e.Parameter != w.parameter || !strings.Contains(e.Message, w.message) || e.Location == "" {
				t.Errorf("%s: error %d is %s, want %+v", name, i, dumpErrors(p.Errors[i:i+1]), w)
			}
			// The detail names the field too (its top-level name at least),
			// for clients that show only it.
			where, _, _ := strings.Cut(strings.TrimPrefix(w.pointer, "/"), "/")
			if where == "" {
				where = w.parameter
			}
			if !strings.Contains(p.Detail, where) {
				t.Errorf("%s: detail %q does not name %s", name, p.Detail, where)
			}
		}
	}
}

func dumpErrors(errs []*FieldError) string {
	b, _ := json.Marshal(errs)
	return string(b)
}

// TestPointerOf: huma's dotted locations become RFC 6901 pointers, and
// back.
func TestPointerOf(t *testing.T) {
	for dotted, want := range map[string]string{
		"memory_mib":             "/memory_mib",
		"env[0]":                 "/env/0",
		"volumes[12].target":     "/volumes/12/target",
		"labels.app.io/name":     "/labels/app.io~1name",
		"secrets.TOKEN.hosts[1]": "/secrets/TOKEN/hosts/1",
		"a~b[0][1]":              "/a~0b/0/1",
	} {
		if got := pointerOf(dotted); got != want {
			t.Errorf("pointerOf(%q) = %q, want %q", dotted, got, want)
		}
	}
	if got := locationOf("/ports/0/host_ip"); got != "body.ports[0].host_ip" {
		t.Errorf("locationOf = %q", got)
	}
}
