package airlock_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/e2b"
	pb "github.com/airlock-run/airlock/internal/e2b/envdpb/process"
	"github.com/airlock-run/airlock/internal/e2b/envdpb/process/processconnect"
	"github.com/airlock-run/airlock/internal/server"
)

// TestE2BAPIFake: the E2B API's control plane on the fake driver, as E2B's
// SDKs call it: the API key, create with metadata (box labels) and a
// timeout (the box's TTL), get, list with metadata and state filters and
// pages, set_timeout, kill; E2B's egress rules and lifecycle as box
// options (deny all with allowOut: an allowlist box; autoPause: an idle
// timeout that suspends) and what a create or update_network cannot map
// refused; the data plane's access tokens; a process started through
// envd's Connect service. TestE2BSDK (internal/e2b) runs
// the official SDKs on real boxes.
func TestE2BAPIFake(t *testing.T) {
	open, ref := lifeHome(t)
	r := open(0)
	ctx := context.Background()
	if _, err := e2b.New(e2b.Config{Runtime: r, Token: "not-hex"}); err == nil {
		t.Error("a token that is not hex was taken")
	}
	token := strings.Repeat("ab12", 8)
	home := t.TempDir()
	var auditMu sync.Mutex
	var audits []e2b.AuditRecord
	es, err := e2b.New(e2b.Config{Runtime: r, Token: token,
		UserSetup: func(context.Context, *airlock.Box, string) (int, int, string, error) { return 0, 0, home, nil },
		Audit: func(rec e2b.AuditRecord) {
			auditMu.Lock()
			audits = append(audits, rec)
			auditMu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	ts := httptest.NewServer(es.Handler())
	defer ts.Close()
	key := "e2b_" + token
	call := func(method, path, k string, body any, hdr ...string) (int, http.Header, []byte) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, ts.URL+path, rd)
		if k != "" {
			req.Header.Set("X-API-Key", k)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	for _, k := range []string{"", "e2b_" + strings.Repeat("0", 32), token} {
		if st, _, _ := call("GET", "/v2/sandboxes", k, nil); st != http.StatusUnauthorized {
			t.Errorf("key %q: status %d, want 401", k, st)
		}
	}
	no := false
	create := func(md map[string]string, timeout int) string {
		t.Helper()
		st, _, b := call("POST", "/sandboxes", key, map[string]any{"templateID": ref, "metadata": md, "timeout": timeout, "allow_internet_access": no})
		if st != http.StatusCreated {
			t.Fatalf("create: %d %s", st, b)
		}
		var c struct{ SandboxID, EnvdVersion, EnvdAccessToken, TemplateID string }
		json.Unmarshal(b, &c)
		if c.SandboxID == "" || c.EnvdVersion != e2b.EnvdVersion || c.EnvdAccessToken == "" || c.TemplateID != ref {
			t.Fatalf("create answered %s", b)
		}
		return c.SandboxID
	}
	for name, body := range map[string]map[string]any{
		"reserved metadata": {"templateID": ref, "metadata": map[string]string{"airlock.e2b/template": "x"}},
		"tenant metadata":   {"templateID": ref, "metadata": map[string]string{server.TenantLabel: "alice"}},
		"zero timeout":      {"templateID": ref, "timeout": 0},
		"timeout past 24h":  {"templateID": ref, "timeout": 86401},
	} {
		if st, _, b := call("POST", "/sandboxes", key, body); st != http.StatusBadRequest {
			t.Errorf("%s: status %d %s, want 400", name, st, b)
		}
	}
	for name, body := range map[string]map[string]any{
		"a name in denyOut":            {"templateID": ref, "network": map[string]any{"denyOut": []string{"example.com"}}},
		"a domain beside some denyOut": {"templateID": ref, "network": map[string]any{"denyOut": []string{"1.2.3.4"}, "allowOut": []string{"example.com"}}},
		"header rules":                 {"templateID": ref, "network": map[string]any{"rules": map[string]any{"api.example.com": []any{}}}},
		"an egress proxy":              {"templateID": ref, "network": map[string]any{"egressProxy": map[string]any{"address": "p:1080"}}},
		"a bad allowOut":               {"templateID": ref, "network": map[string]any{"allowOut": []string{"10.0.0.0/33"}, "denyOut": []string{"0.0.0.0/0"}}},
		"pause without memory":         {"templateID": ref, "autoPause": true, "autoPauseMemory": false},
		"autoResume without a pause":   {"templateID": ref, "autoResume": map[string]bool{"enabled": true}},
		"a host path as a volume":      {"templateID": ref, "volumeMounts": []map[string]string{{"name": "/etc", "path": "/mnt/etc"}}},
		"a relative volume name":       {"templateID": ref, "volumeMounts": []map[string]string{{"name": "../x", "path": "/mnt/x"}}},
		"a relative mount path":        {"templateID": ref, "volumeMounts": []map[string]string{{"name": "data", "path": "mnt"}}},
		"volumes with autoPause":       {"templateID": ref, "autoPause": true, "volumeMounts": []map[string]string{{"name": "data", "path": "/mnt/data"}}},
	} {
		if st, _, b := call("POST", "/v2/sandboxes", key, body); st != http.StatusBadRequest {
			t.Errorf("%s: status %d %s, want 400", name, st, b)
		}
	}
	// E2B's egress rules and lifecycle as box options.
	optsOf := func(body map[string]any) (string, airlock.BoxOptions, map[string]any) {
		t.Helper()
		st, _, b := call("POST", "/v2/sandboxes", key, body)
		if st != http.StatusCreated {
			t.Fatalf("create %v: %d %s", body, st, b)
		}
		var c struct{ SandboxID string }
		json.Unmarshal(b, &c)
		box, err := r.Get(ctx, c.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := box.Info(ctx)
		_, _, b = call("GET", "/sandboxes/"+c.SandboxID, key, nil)
		var d map[string]any
		json.Unmarshal(b, &d)
		return c.SandboxID, info.Options, d
	}
	id, o, d := optsOf(map[string]any{"templateID": ref, "timeout": 60, "network": map[string]any{"denyOut": []string{"0.0.0.0/0"}, "allowOut": []string{"198.51.100.7", "api.example.com"}}})
	if o.Network != airlock.NetworkAllowlist || strings.Join(o.AllowNet, ",") != "198.51.100.7,api.example.com" || o.TTL != time.Minute || o.IdleTimeout != 0 {
		t.Errorf("deny all, allow two: options %+v", o)
	}
	if n, _ := json.Marshal(d["network"]); string(n) != `{"allowOut":["198.51.100.7","api.example.com"],"denyOut":["0.0.0.0/0"]}` {
		t.Errorf("get: network %s", n)
	}
	if l, _ := json.Marshal(d["lifecycle"]); string(l) != `{"autoResume":false,"onTimeout":"kill"}` {
		t.Errorf("get: lifecycle %s", l)
	}
	call("DELETE", "/sandboxes/"+id, key, nil)
	// A denyOut of some addresses: a public box with a DenyNet, allowOut
	// its exceptions.
	id, o, d = optsOf(map[string]any{"templateID": ref, "network": map[string]any{"denyOut": []string{"198.51.100.0/24"}, "allowOut": []string{"198.51.100.7"}}})
	if o.Network != airlock.NetworkPublic || strings.Join(o.DenyNet, ",") != "198.51.100.0/24" || strings.Join(o.AllowNet, ",") != "198.51.100.7" {
		t.Errorf("deny some, allow one: options %+v", o)
	}
	if n, _ := json.Marshal(d["network"]); string(n) != `{"allowOut":["198.51.100.7"],"denyOut":["198.51.100.0/24"]}` {
		t.Errorf("get: network %s", n)
	}
	call("DELETE", "/sandboxes/"+id, key, nil)
	id, o, d = optsOf(map[string]any{"templateID": ref, "timeout": 90, "allow_internet_access": false, "autoPause": true, "autoResume": map[string]bool{"enabled": true}})
	if o.Network != airlock.NetworkAllowlist || len(o.AllowNet) != 0 || o.TTL != 0 || o.IdleTimeout != 90*time.Second || o.IdleAction != airlock.IdleSuspend {
		t.Errorf("no internet, auto-pause: options %+v", o)
	}
	if l, _ := json.Marshal(d["lifecycle"]); string(l) != `{"autoResume":true,"onTimeout":"pause"}` || d["allowInternetAccess"] != false {
		t.Errorf("get: lifecycle %s, allowInternetAccess %v", l, d["allowInternetAccess"])
	}
	if md, _ := json.Marshal(d["metadata"]); string(md) != "{}" {
		t.Errorf("get: metadata %s: airlock's own labels must not show", md)
	}
	if end, _ := time.Parse(time.RFC3339Nano, d["endAt"].(string)); time.Until(end) < 80*time.Second || time.Until(end) > 90*time.Second {
		t.Errorf("an auto-pause sandbox's endAt %v: want its idle deadline, about 90 s from now", d["endAt"])
	}
	// set_timeout of an auto-pause sandbox moves its idle deadline, not a TTL.
	if st, _, b := call("POST", "/sandboxes/"+id+"/timeout", key, map[string]int{"timeout": 600}); st != http.StatusNoContent {
		t.Errorf("set timeout: %d %s", st, b)
	}
	box, _ := r.Get(ctx, id)
	if bi, _ := box.Info(ctx); bi.Options.IdleTimeout != 10*time.Minute || bi.Options.TTL != 0 || time.Until(bi.IdleDeadline) < 590*time.Second {
		t.Errorf("after set_timeout 600: idle timeout %v (deadline %v), ttl %v", bi.Options.IdleTimeout, bi.IdleDeadline, bi.Options.TTL)
	}
	// update_network: what a create refuses is refused; an unknown
	// sandbox is 404.
	for _, c := range []struct {
		id   string
		body any
		want int
	}{
		{id, map[string]any{"denyOut": []string{"example.com"}}, 400},
		{id, map[string]any{"rules": map[string]any{"x.example.com": []any{}}}, 400},
		{id, map[string]any{"allowOut": []string{"10.0.0.0/33"}}, 400},
		{"nosuchbox", map[string]any{}, 404},
	} {
		if st, _, b := call("PUT", "/sandboxes/"+c.id+"/network", key, c.body); st != c.want {
			t.Errorf("update_network %v: %d %s, want %d", c.body, st, b, c.want)
		}
	}
	// It replaces the rules: what the body leaves out is cleared.
	for _, c := range []struct {
		body        any
		mode        airlock.NetworkMode
		allow, deny string
	}{
		{map[string]any{"allowOut": []string{"198.51.100.9"}, "denyOut": []string{"0.0.0.0/0"}}, airlock.NetworkAllowlist, "198.51.100.9", ""},
		{map[string]any{"denyOut": []string{"203.0.113.0/24"}, "allowOut": []string{"203.0.113.9"}}, airlock.NetworkPublic, "203.0.113.9", "203.0.113.0/24"},
		{map[string]any{}, airlock.NetworkPublic, "", ""},
		{map[string]any{"allow_internet_access": false}, airlock.NetworkAllowlist, "", ""},
	} {
		if st, _, b := call("PUT", "/sandboxes/"+id+"/network", key, c.body); st != http.StatusNoContent {
			t.Errorf("update_network %v: %d %s", c.body, st, b)
		}
		if bi, _ := box.Info(ctx); bi.Options.Network != c.mode || strings.Join(bi.Options.AllowNet, ",") != c.allow || strings.Join(bi.Options.DenyNet, ",") != c.deny {
			t.Errorf("after update_network %v: network %s allow %v deny %v, want %s %q %q", c.body, bi.Options.Network, bi.Options.AllowNet, bi.Options.DenyNet, c.mode, c.allow, c.deny)
		}
	}
	call("DELETE", "/sandboxes/"+id, key, nil)

	a := create(map[string]string{"team": "a"}, 60)
	b := create(map[string]string{"team": "b"}, 60)
	plain, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone})
	if err != nil {
		t.Fatal(err)
	}

	var got struct {
		SandboxID string
		Metadata  map[string]string
		State     string
		EndAt     time.Time
	}
	st, _, body := call("GET", "/sandboxes/"+a, key, nil)
	json.Unmarshal(body, &got)
	if st != 200 || got.SandboxID != a || got.Metadata["team"] != "a" || len(got.Metadata) != 1 || got.State != "running" {
		t.Errorf("get: %d %s", st, body)
	}
	if left := time.Until(got.EndAt); left < 50*time.Second || left > 60*time.Second {
		t.Errorf("endAt %v: want about 60 s from now", got.EndAt)
	}
	if st, _, _ := call("GET", "/sandboxes/"+plain.ID(), key, nil); st != http.StatusNotFound {
		t.Errorf("a box not made through the E2B API: get %d, want 404", st)
	}
	ids := func(query string) ([]string, string) {
		t.Helper()
		st, h, body := call("GET", "/v2/sandboxes"+query, key, nil)
		if st != 200 {
			t.Fatalf("list %s: %d %s", query, st, body)
		}
		var l []struct{ SandboxID string }
		json.Unmarshal(body, &l)
		var out []string
		for _, x := range l {
			out = append(out, x.SandboxID)
		}
		return out, h.Get("X-Next-Token")
	}
	if l, _ := ids(""); len(l) != 2 {
		t.Errorf("list: %v, want the two sandboxes (not the plain box)", l)
	}
	if l, _ := ids("?metadata=team%3Db"); len(l) != 1 || l[0] != b {
		t.Errorf("list metadata team=b: %v, want [%s]", l, b)
	}
	if l, _ := ids("?state=paused"); len(l) != 0 {
		t.Errorf("list paused: %v, want none", l)
	}
	p1, next := ids("?limit=1")
	p2, last := ids("?limit=1&nextToken=" + next)
	if len(p1) != 1 || len(p2) != 1 || p1[0] == p2[0] || last != "" {
		t.Errorf("pages: %v (next %q), %v (next %q)", p1, next, p2, last)
	}

	if st, _, body := call("POST", "/sandboxes/"+a+"/timeout", key, map[string]int{"timeout": 3600}); st != http.StatusNoContent {
		t.Errorf("set timeout: %d %s", st, body)
	}
	info, _ := r.Get(ctx, a)
	bi, _ := info.Info(ctx)
	if left := time.Until(bi.ExpiresAt); left < 3590*time.Second || left > 3600*time.Second {
		t.Errorf("after set_timeout 3600 the box expires in %v", left)
	}

	// The data plane: a sandbox's own token, never another's.
	var tokA struct{ EnvdAccessToken string }
	_, _, body = call("POST", "/sandboxes/"+a+"/connect", key, map[string]any{})
	json.Unmarshal(body, &tokA)
	for _, c := range []struct {
		tok  string
		want int
	}{{"", 401}, {"wrong", 401}, {tokA.EnvdAccessToken, 204}} {
		if st, _, _ := call("GET", "/health", "", nil, "E2b-Sandbox-Id", a, "E2b-Sandbox-Port", "49983", "X-Access-Token", c.tok); st != c.want {
			t.Errorf("health with token %q: %d, want %d", c.tok, st, c.want)
		}
	}
	if st, _, _ := call("GET", "/health", "", nil, "E2b-Sandbox-Id", b, "E2b-Sandbox-Port", "49983", "X-Access-Token", tokA.EnvdAccessToken); st != 401 {
		t.Errorf("sandbox b with a's token: %d, want 401", st)
	}

	// A process through envd's Connect service: start, output, exit code.
	pc := processconnect.NewProcessClient(http.DefaultClient, ts.URL, connect.WithProtoJSON())
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo out; echo err >&2; exit 3"}}})
	req.Header().Set("E2b-Sandbox-Id", a)
	req.Header().Set("X-Access-Token", tokA.EnvdAccessToken)
	stream, err := pc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut string
	var end *pb.ProcessEvent_EndEvent
	var pid uint32
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			pid = ev.GetStart().GetPid()
		case ev.GetData() != nil:
			out += string(ev.GetData().GetStdout())
			errOut += string(ev.GetData().GetStderr())
		case ev.GetEnd() != nil:
			end = ev.GetEnd()
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if pid == 0 || out != "out\n" || errOut != "err\n" || end == nil || end.GetExitCode() != 3 || !end.GetExited() {
		t.Errorf("process: pid %d, stdout %q, stderr %q, end %v", pid, out, errOut, end)
	}
	auditMu.Lock()
	if len(audits) != 1 || audits[0].Kind != "exec_stream" || audits[0].BoxID != a || audits[0].ExitCode == nil || *audits[0].ExitCode != 3 || audits[0].Cmd[0] != "/bin/sh" {
		t.Errorf("audit records: %+v, want the process's, exit 3", audits)
	}
	auditMu.Unlock()

	// Snapshots and fork: what airlock cannot do is refused, saying so.
	for _, c := range []struct {
		method, path string
		body         any
		want         int
	}{
		{"POST", "/sandboxes/" + a + "/fork", map[string]int{"count": 21}, 400},
		{"POST", "/sandboxes/" + a + "/snapshots", map[string]bool{"memory": false}, 400},
		{"POST", "/sandboxes/" + a + "/snapshots", map[string]string{"name": "team/snap:v1"}, 400},
		{"POST", "/sandboxes/nosuchbox/snapshots", map[string]string{}, 404},
		{"DELETE", "/templates/base", nil, 404},
		{"DELETE", "/templates/nosuchsnapshot", nil, 404},
		{"POST", "/sandboxes/" + a + "/pause", map[string]bool{"memory": false}, 400},
	} {
		if st, _, body := call(c.method, c.path, key, c.body); st != c.want {
			t.Errorf("%s %s %v: %d %s, want %d", c.method, c.path, c.body, st, body, c.want)
		}
	}
	if st, _, body := call("GET", "/snapshots?sandboxID="+a, key, nil); st != 200 || strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("list snapshots: %d %s, want []", st, body)
	}

	// Signed URLs (download_url, upload_url): no E2B headers and no
	// token; envd's v1 signature names the path, operation, user and
	// the sandbox (its access token).
	sign := func(path, op, tok string, exp int64) string {
		raw := path + ":" + op + "::" + tok
		q := url.Values{"path": {path}}
		if exp != 0 {
			raw += ":" + strconv.FormatInt(exp, 10)
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		sum := sha256.Sum256([]byte(raw))
		q.Set("signature", "v1_"+base64.RawStdEncoding.EncodeToString(sum[:]))
		return "/files?" + q.Encode()
	}
	fileAt := home + "/signed.txt"
	later := time.Now().Add(time.Hour).Unix()
	if st, _, body := call("POST", sign(fileAt, "write", tokA.EnvdAccessToken, later), "", "signed bytes", "Content-Type", "application/octet-stream"); st != 200 {
		t.Errorf("signed upload: %d %s", st, body)
	}
	if st, _, body := call("GET", sign(fileAt, "read", tokA.EnvdAccessToken, 0), "", nil); st != 200 || string(body) != `"signed bytes"` {
		t.Errorf("signed download: %d %s", st, body)
	}
	for name, path := range map[string]string{
		"expired":             sign(fileAt, "read", tokA.EnvdAccessToken, time.Now().Add(-time.Minute).Unix()),
		"a write's signature": strings.Replace(sign(fileAt, "write", tokA.EnvdAccessToken, 0), "write", "read", 1),
		"another path":        strings.Replace(sign(fileAt, "read", tokA.EnvdAccessToken, 0), "signed.txt", "other.txt", 1),
		"a wrong token":       sign(fileAt, "read", "0123", 0),
		"no signature":        "/files?path=" + url.QueryEscape(fileAt) + "&signature=",
	} {
		if st, _, body := call("GET", path, "", nil); st != http.StatusUnauthorized {
			t.Errorf("signed download, %s: %d %s, want 401", name, st, body)
		}
		if st, _, body := call("GET", path, "", nil, "E2b-Sandbox-Id", a); st != http.StatusUnauthorized {
			t.Errorf("signed download with E2b-Sandbox-Id, %s: %d %s, want 401", name, st, body)
		}
	}
	if st, _, body := call("GET", sign(fileAt, "read", tokA.EnvdAccessToken, 0), "", nil, "E2b-Sandbox-Id", b); st != http.StatusUnauthorized {
		t.Errorf("a's signed URL for sandbox b: %d %s, want 401", st, body)
	}
	if st, _, body := call("GET", sign(fileAt, "read", tokA.EnvdAccessToken, 0), "", nil, "X-Access-Token", "wrong"); st != http.StatusUnauthorized {
		t.Errorf("a signed URL with a wrong token in the header: %d %s, want 401 (as envd)", st, body)
	}

	if st, _, _ := call("DELETE", "/sandboxes/"+a, key, nil); st != http.StatusNoContent {
		t.Errorf("kill: %d", st)
	}
	if st, _, _ := call("GET", "/sandboxes/"+a, key, nil); st != http.StatusNotFound {
		t.Errorf("get after kill: %d, want 404", st)
	}
	if st, _, _ := call("DELETE", "/sandboxes/"+a, key, nil); st != http.StatusNotFound {
		t.Errorf("kill twice: %d, want 404", st)
	}
	if _, err := r.Get(ctx, plain.ID()); err != nil {
		t.Errorf("the plain box: %v", err)
	}
}

// TestHostileClientE2B: what an E2B API client (holding the key) sends
// past the bounds is refused with a status the SDK maps, and makes
// nothing: a body over 1 MiB, too many or too large metadata, an endless
// list page, an RPC message over 1 MiB.
func TestHostileClientE2B(t *testing.T) {
	open, ref := lifeHome(t)
	r := open(0)
	token := strings.Repeat("cd34", 8)
	es, err := e2b.New(e2b.Config{Runtime: r, Token: token,
		UserSetup: func(context.Context, *airlock.Box, string) (int, int, string, error) { return 0, 0, t.TempDir(), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	ts := httptest.NewServer(es.Handler())
	defer ts.Close()
	do := func(method, path string, body []byte, hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, bytes.NewReader(body))
		req.Header.Set("X-API-Key", "e2b_"+token)
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, string(b)
	}
	big := append([]byte(`{"templateID":"`+ref+`","metadata":{"k":"`), bytes.Repeat([]byte("x"), 2<<20)...)
	big = append(big, `"}}`...)
	if st, body := do("POST", "/sandboxes", big); st != http.StatusRequestEntityTooLarge {
		t.Errorf("a 2 MiB create body: %d %s, want 413", st, body)
	}
	many := map[string]string{}
	for i := range airlock.MaxLabels + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	for name, md := range map[string]map[string]string{"65 keys": many, "a 2 KiB value": {"k": strings.Repeat("v", 2048)}} {
		raw, _ := json.Marshal(map[string]any{"templateID": ref, "metadata": md, "allow_internet_access": false})
		if st, body := do("POST", "/sandboxes", raw); st != http.StatusBadRequest {
			t.Errorf("metadata of %s: %d %s, want 400", name, st, body)
		}
	}
	if st, _ := do("GET", "/v2/sandboxes?limit=1000000", nil); st != http.StatusBadRequest {
		t.Errorf("a list page of a million: %d, want 400", st)
	}
	if boxes, _ := r.List(context.Background()); len(boxes) != 0 {
		t.Errorf("refused creates left %d boxes", len(boxes))
	}
	raw, _ := json.Marshal(map[string]any{"templateID": ref, "allow_internet_access": false})
	st, body := do("POST", "/sandboxes", raw)
	var c struct{ SandboxID, EnvdAccessToken string }
	json.Unmarshal([]byte(body), &c)
	if st != http.StatusCreated {
		t.Fatalf("create: %d %s", st, body)
	}
	huge, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/true", "envs": map[string]string{"X": strings.Repeat("y", 2<<20)}}})
	st, body = do("POST", "/process.Process/List", huge, "E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", c.EnvdAccessToken)
	if st == http.StatusOK {
		t.Errorf("a 2 MiB RPC message: %d %s, want a refusal", st, body)
	}
}

// TestHostileClientE2BPullSSRF: a template naming a registry on the
// server's loopback is not pulled: the create obeys the server's network
// grants, as a REST create does (403 without --allow-private-net).
func TestHostileClientE2BPullSSRF(t *testing.T) {
	var hits atomic.Int64
	intranet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusBadRequest)
	}))
	defer intranet.Close()
	open, _ := lifeHome(t)
	r := open(0)
	token := strings.Repeat("ef56", 8)
	srv := server.New(server.Config{Runtime: r, Token: token})
	es, err := e2b.New(e2b.Config{Runtime: r, Token: token, CheckBox: srv.CheckBox, PullContext: srv.PullContext})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	ts := httptest.NewServer(es.Handler())
	defer ts.Close()
	raw, _ := json.Marshal(map[string]any{"templateID": strings.TrimPrefix(intranet.URL, "http://") + "/x/y:z"})
	req, _ := http.NewRequest("POST", ts.URL+"/sandboxes", bytes.NewReader(raw))
	req.Header.Set("X-API-Key", "e2b_"+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "--allow-private-net") {
		t.Errorf("create from a loopback registry: %d %s, want 403 naming --allow-private-net", resp.StatusCode, body)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the loopback service got %d requests", n)
	}
}

// TestHostileClientE2BStartPastMaxBoxes: a connect that would start a
// stopped sandbox past --max-boxes is refused (403), as a REST start is.
func TestHostileClientE2BStartPastMaxBoxes(t *testing.T) {
	open, ref := lifeHome(t)
	r := open(0)
	ctx := context.Background()
	token := strings.Repeat("9a8b", 8)
	srv := server.New(server.Config{Runtime: r, Token: token, Policy: server.Policy{MaxBoxes: 1}})
	es, err := e2b.New(e2b.Config{Runtime: r, Token: token, CheckBox: srv.CheckBox, CheckStart: srv.CheckStart,
		UserSetup: func(context.Context, *airlock.Box, string) (int, int, string, error) { return 0, 0, t.TempDir(), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	ts := httptest.NewServer(es.Handler())
	defer ts.Close()
	post := func(path string, body any) (int, string) {
		raw, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", ts.URL+path, bytes.NewReader(raw))
		req.Header.Set("X-API-Key", "e2b_"+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	st, body := post("/sandboxes", map[string]any{"templateID": ref, "allow_internet_access": false})
	var c struct{ SandboxID string }
	json.Unmarshal([]byte(body), &c)
	if st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}
	if st, body := post("/sandboxes", map[string]any{"templateID": ref, "allow_internet_access": false}); st != http.StatusForbidden {
		t.Errorf("a second sandbox past --max-boxes 1: %d %s, want 403", st, body)
	}
	b, _ := r.Get(ctx, c.SandboxID)
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Remove(ctx, true)
	if st, body := post("/sandboxes/"+c.SandboxID+"/connect", map[string]any{}); st != http.StatusForbidden || !strings.Contains(body, "--max-boxes") {
		t.Errorf("connect starting a box past --max-boxes: %d %s, want 403", st, body)
	}
	if info, _ := b.Info(ctx); info.State != airlock.BoxStopped {
		t.Errorf("the refused sandbox is %s, want stopped", info.State)
	}
}
