package airlock_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/mcpserver"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/tenant"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// tenantEnv is a server on the fake driver with an admin token and two
// tenants, alice (quotas) and bob.
type tenantEnv struct {
	t                  *testing.T
	r                  *airlock.Runtime
	ref                string
	url                string
	file               string
	admin, alice, bob  string
	audit              string
	close              func()
	reopenWithSameHome func() *tenantEnv
}

const adminToken = "admin-token"

func newTenantEnv(t *testing.T, aliceQuota tenant.Quota) *tenantEnv {
	t.Helper()
	open, ref := snapshottingHome(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "tenants.json")
	alice, bob := tenant.NewToken(), tenant.NewToken()
	if err := tenant.Add(file, tenant.Tenant{Name: "alice", Quota: aliceQuota}, alice); err != nil {
		t.Fatal(err)
	}
	if err := tenant.Add(file, tenant.Tenant{Name: "bob"}, bob); err != nil {
		t.Fatal(err)
	}
	var start func(r *airlock.Runtime, ev *server.Events) *tenantEnv
	start = func(r *airlock.Runtime, ev *server.Events) *tenantEnv {
		set, err := tenant.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		auditPath := filepath.Join(dir, "audit.log")
		audit, err := server.OpenAuditLog(auditPath, 0)
		if err != nil {
			t.Fatal(err)
		}
		s := server.New(server.Config{Runtime: r, Token: adminToken, Tenants: set, Audit: audit, Events: ev,
			Metrics: server.NewMetrics("test"), MaxExecsPerClient: 8,
			// The fake's disks take no room: the host's free space is
			// no part of these tests.
			Policy: server.Policy{MinFreeDiskMiB: server.NoLimit}})
		ts := httptest.NewServer(s.Handler(true))
		e := &tenantEnv{t: t, r: r, ref: ref, url: ts.URL, file: file, admin: adminToken, alice: alice, bob: bob, audit: auditPath}
		e.close = func() { ts.Close(); audit.Close() }
		e.reopenWithSameHome = func() *tenantEnv {
			e.close()
			r.Close()
			ev := server.NewEvents()
			return start(open(0, ev), ev)
		}
		t.Cleanup(e.close)
		return e
	}
	ev := server.NewEvents()
	return start(open(0, ev), ev)
}

// snapshottingHome is lifeHome on the fake driver that snapshots
// (fake.Snapshotting).
func snapshottingHome(t *testing.T) (open func(reap time.Duration, obs ...airlock.Observer) *airlock.Runtime, ref string) {
	t.Helper()
	ref = "test/fake:v1"
	drv := fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT"))
	home, images, cache := t.TempDir(), fakeImageStore(t, ref), t.TempDir()
	var mu sync.Mutex
	var opened []*airlock.Runtime
	t.Cleanup(func() { // boxes first: their agents are host processes
		mu.Lock()
		defer mu.Unlock()
		for _, r := range opened {
			boxes, _ := r.List(context.Background())
			for _, b := range boxes {
				r.Remove(context.Background(), b.ID, true)
			}
			r.Close()
		}
	})
	return func(reap time.Duration, obs ...airlock.Observer) *airlock.Runtime {
		t.Helper()
		o := airlock.Options{Home: home, ImagesDir: images, CacheDir: cache, Warn: func(string) {}, ReapInterval: reap}
		if len(obs) > 0 {
			o.Observer = obs[0]
		}
		r, err := airlock.OpenWithDriver(o, drv)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		opened = append(opened, r)
		mu.Unlock()
		return r
	}, ref
}

// call makes a request with token; it returns the status and body.
func (e *tenantEnv) call(token, method, path string, body any) (int, []byte) {
	e.t.Helper()
	var rd io.Reader
	ct := ""
	switch b := body.(type) {
	case nil:
	case []byte:
		rd, ct = bytes.NewReader(b), "application/octet-stream"
	default:
		raw, _ := json.Marshal(b)
		rd, ct = bytes.NewReader(raw), "application/json"
	}
	req, _ := http.NewRequest(method, e.url+path, rd)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (e *tenantEnv) create(token string, spec map[string]any) (int, server.Box, server.Problem) {
	e.t.Helper()
	if spec == nil {
		spec = map[string]any{}
	}
	spec["image"], spec["network"] = e.ref, "none"
	st, body := e.call(token, "POST", "/v1/boxes", spec)
	var b server.Box
	var p server.Problem
	if st == 201 {
		json.Unmarshal(body, &b)
	} else {
		json.Unmarshal(body, &p)
	}
	return st, b, p
}

func (e *tenantEnv) list(token string) []server.Box {
	e.t.Helper()
	st, body := e.call(token, "GET", "/v1/boxes", nil)
	if st != 200 {
		e.t.Fatalf("list: %d %s", st, body)
	}
	var l server.BoxList
	json.Unmarshal(body, &l)
	return l.Boxes
}

func ids(bs []server.Box) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.ID)
	}
	slices.Sort(out)
	return out
}

// TestTenantsIsolation: each tenant lists and reaches only its own boxes;
// names are per tenant; the admin token sees all; no client can set the
// tenant label; and ownership survives a restart of the server.
func TestTenantsIsolation(t *testing.T) {
	e := newTenantEnv(t, tenant.Quota{})
	st, a, p := e.create(e.alice, map[string]any{"name": "web", "labels": map[string]string{"team": "a"}})
	if st != 201 {
		t.Fatalf("alice create: %d %+v", st, p)
	}
	if a.Name != "web" || a.Labels[server.TenantLabel] != "" || a.Labels["team"] != "a" {
		t.Errorf("alice sees her box as %+v: want name web, her label, no tenant label", a)
	}
	// bob may take the same name: names are per tenant.
	st, b, p := e.create(e.bob, map[string]any{"name": "web"})
	if st != 201 {
		t.Fatalf("bob create of the name alice uses: %d %+v", st, p)
	}
	if st, _, p := e.create(e.bob, map[string]any{"name": "web"}); st != 409 || p.Code != server.CodeNameInUse || strings.Contains(p.Detail, "bob.") {
		t.Errorf("bob's second web: %d %+v, want 409 name_in_use naming web as he did", st, p)
	}
	if got := ids(e.list(e.alice)); !slices.Equal(got, []string{a.ID}) {
		t.Errorf("alice lists %v, want only %s", got, a.ID)
	}
	if got := ids(e.list(e.bob)); !slices.Equal(got, []string{b.ID}) {
		t.Errorf("bob lists %v, want only %s", got, b.ID)
	}
	all := e.list(e.admin)
	if got, want := ids(all), ids([]server.Box{a, b}); !slices.Equal(got, want) {
		t.Errorf("admin lists %v, want both %v", got, want)
	}
	for _, x := range all {
		if owner := x.Labels[server.TenantLabel]; (x.ID == a.ID && owner != "alice") || (x.ID == b.ID && owner != "bob") {
			t.Errorf("admin sees box %s with tenant label %q", x.ID, owner)
		}
	}
	// By name each reaches its own.
	for tok, want := range map[string]string{e.alice: a.ID, e.bob: b.ID} {
		st, body := e.call(tok, "GET", "/v1/boxes/web", nil)
		var got server.Box
		json.Unmarshal(body, &got)
		if st != 200 || got.ID != want {
			t.Errorf("GET /v1/boxes/web: %d %s, want %s", st, got.ID, want)
		}
	}
	// A client-set tenant label grants nothing: refused, for tenants and
	// the admin alike.
	for _, tok := range []string{e.bob, e.admin} {
		if st, _, p := e.create(tok, map[string]any{"labels": map[string]string{server.TenantLabel: "alice"}}); st != 400 || !strings.Contains(p.Detail, server.TenantLabel) {
			t.Errorf("create with label %s=alice: %d %+v, want 400", server.TenantLabel, st, p)
		}
	}
	if got := ids(e.list(e.alice)); len(got) != 1 {
		t.Errorf("alice lists %v after the forging attempts, want her one box", got)
	}
	// A restart of the server (and of the runtime) keeps who owns what.
	e2 := e.reopenWithSameHome()
	if st, _ := e2.call(e2.bob, "GET", "/v1/boxes/"+a.ID, nil); st != 404 {
		t.Errorf("after a restart bob gets alice's box: %d, want 404", st)
	}
	if got := ids(e2.list(e2.alice)); !slices.Equal(got, []string{a.ID}) {
		t.Errorf("after a restart alice lists %v, want %s", got, a.ID)
	}
}

// TestTenantsEveryBoxRoute walks every per-box route of the OpenAPI
// document with bob's token against alice's box: each answers 404
// box_not_found, the same answer as for a box that does not exist (no
// existence oracle), and the box is untouched.
func TestTenantsEveryBoxRoute(t *testing.T) {
	e := newTenantEnv(t, tenant.Quota{})
	st, a, p := e.create(e.alice, map[string]any{"name": "mine"})
	if st != 201 {
		t.Fatalf("alice create: %d %+v", st, p)
	}
	if st, _, p := e.create(e.bob, nil); st != 201 {
		t.Fatalf("bob create: %d %+v", st, p)
	}
	spec, err := server.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(spec, &doc); err != nil {
		t.Fatal(err)
	}
	// Valid bodies, so that each call gets past validation to the box.
	bodies := map[string]any{
		"POST /v1/boxes/{id}/code/install":       map[string]any{"packages": []string{"x"}},
		"POST /v1/boxes/{id}/code/run":           map[string]any{"code": "1"},
		"POST /v1/boxes/{id}/contexts/{ctx}/run": map[string]any{"code": "1"},
		"POST /v1/boxes/{id}/exec":               map[string]any{"cmd": []string{"true"}},
		"POST /v1/boxes/{id}/files/mkdir":        map[string]any{"path": "/tmp/x"},
		"POST /v1/boxes/{id}/fork":               map[string]any{},
		"POST /v1/boxes/{id}/pause":              map[string]any{},
		"POST /v1/boxes/{id}/snapshot":           map[string]any{"name": "s"},
		"PUT /v1/boxes/{id}/files":               []byte("data"),
		"PUT /v1/boxes/{id}/archive":             []byte{},
		"PUT /v1/boxes/{id}/secrets/{name}":      map[string]any{"value": "v"},
		"POST /v1/boxes/{id}/checkpoints":        map[string]any{"name": "c"},
		"POST /v1/boxes/{id}/rollback":           map[string]any{"name": "c"},
	}
	routes := 0
	for path, ops := range doc.Paths {
		if !strings.Contains(path, "{id}") {
			continue
		}
		for method := range ops {
			method = strings.ToUpper(method)
			if !slices.Contains([]string{"GET", "POST", "PUT", "DELETE", "PATCH"}, method) {
				continue
			}
			routes++
			key := method + " " + path
			t.Run(key, func(t *testing.T) {
				at := func(id string) string {
					p := strings.NewReplacer("{id}", id, "{ctx}", "c1", "{exec}", "e1", "{name}", "TOKEN").Replace(path)
					return p + "?path=/etc/hostname"
				}
				// By id, by a prefix of it, and by alice's name.
				for _, ref := range []string{a.ID, a.ID[:8], "mine"} {
					st, body := e.call(e.bob, method, at(ref), bodies[key])
					var p server.Problem
					json.Unmarshal(body, &p)
					if st != 404 || p.Code != server.CodeBoxNotFound {
						t.Errorf("bob on alice's box (%s): %d %s, want 404 box_not_found", ref, st, body)
						continue
					}
					st2, body2 := e.call(e.bob, method, at("0a0b0c0d0e0f"), bodies[key])
					var p2 server.Problem
					json.Unmarshal(body2, &p2)
					if st2 != st || p2.Code != p.Code || strings.ReplaceAll(p2.Detail, "0a0b0c0d0e0f", ref) != p.Detail {
						t.Errorf("bob on alice's box: %d %+v; on no box: %d %+v: want the same answer", st, p, st2, p2)
					}
				}
			})
		}
	}
	if routes < 20 {
		t.Errorf("walked %d per-box routes, want every one of the document (at least 20)", routes)
	}
	// Alice's box is as it was: running, named, not forked or snapshotted.
	st, body := e.call(e.alice, "GET", "/v1/boxes/"+a.ID, nil)
	var got server.Box
	json.Unmarshal(body, &got)
	if st != 200 || got.State != "running" || got.Name != "mine" {
		t.Errorf("alice's box after bob's calls: %d %+v, want running, named mine", st, got)
	}
	if n := len(e.list(e.admin)); n != 2 {
		t.Errorf("the home holds %d boxes after bob's calls, want 2 (no fork)", n)
	}
	st, body = e.call(e.admin, "GET", "/v1/snapshots", nil)
	if st != 200 || strings.Contains(string(body), `"name"`) {
		t.Errorf("snapshots after bob's calls: %d %s, want none", st, body)
	}
}

// TestTenantsQuotas: a tenant's quotas (boxes, vCPUs, memory, concurrent
// execs, snapshots) refuse with 403 quota_exceeded (429 for execs), per
// tenant: bob is not bounded by alice's.
func TestTenantsQuotas(t *testing.T) {
	e := newTenantEnv(t, tenant.Quota{Boxes: 2, CPUs: 3, MemoryMiB: 1024, Execs: 1, Snapshots: 1})
	st, a, p := e.create(e.alice, map[string]any{"cpus": 2, "memory_mib": 256})
	if st != 201 {
		t.Fatalf("alice's first box: %d %+v", st, p)
	}
	if st, _, p := e.create(e.alice, map[string]any{"cpus": 2, "memory_mib": 256}); st != 403 || p.Code != server.CodeQuotaExceeded || !strings.Contains(p.Detail, "vCPUs") {
		t.Errorf("past alice's vCPUs: %d %+v, want 403 quota_exceeded naming vCPUs", st, p)
	}
	if st, _, p := e.create(e.alice, map[string]any{"memory_mib": 1024}); st != 403 || p.Code != server.CodeQuotaExceeded || !strings.Contains(p.Detail, "memory") {
		t.Errorf("past alice's memory: %d %+v, want 403 quota_exceeded naming memory", st, p)
	}
	if st, _, p := e.create(e.alice, map[string]any{"memory_mib": 256}); st != 201 {
		t.Fatalf("alice's second box: %d %+v", st, p)
	}
	if st, _, p := e.create(e.alice, map[string]any{"memory_mib": 128}); st != 403 || p.Code != server.CodeQuotaExceeded || !strings.Contains(p.Detail, "boxes") {
		t.Errorf("alice's third box: %d %+v, want 403 quota_exceeded naming boxes", st, p)
	}
	for range 3 {
		if st, _, p := e.create(e.bob, nil); st != 201 {
			t.Fatalf("bob (no quota): %d %+v", st, p)
		}
	}
	// A stopped box frees its place; starting it again takes one.
	if st, body := e.call(e.alice, "POST", "/v1/boxes/"+a.ID+"/stop", nil); st != 200 {
		t.Fatalf("stop: %d %s", st, body)
	}
	st, c, p := e.create(e.alice, map[string]any{"memory_mib": 128})
	if st != 201 {
		t.Fatalf("alice's box in the stopped one's place: %d %+v", st, p)
	}
	if st, body := e.call(e.alice, "POST", "/v1/boxes/"+a.ID+"/start", nil); st != 403 || !strings.Contains(string(body), server.CodeQuotaExceeded) {
		t.Errorf("starting the stopped box at the quota: %d %s, want 403 quota_exceeded", st, body)
	}
	// Concurrent execs: one at a time for alice.
	done := make(chan int, 1)
	go func() {
		st, _ := e.call(e.alice, "POST", "/v1/boxes/"+c.ID+"/exec", map[string]any{"cmd": []string{"sleep", "30"}, "timeout": 60})
		done <- st
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body := e.call(e.alice, "GET", "/v1/boxes/"+c.ID+"/execs", nil)
		var l server.ExecList
		json.Unmarshal(body, &l)
		if len(l.Execs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the long exec never showed in the list: %s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, body := e.call(e.alice, "POST", "/v1/boxes/"+c.ID+"/exec", map[string]any{"cmd": []string{"true"}}); st != 429 || !strings.Contains(string(body), "tenant alice") {
		t.Errorf("alice's second exec at once: %d %s, want 429 naming her", st, body)
	}
	bobs := e.list(e.bob)
	if st, body := e.call(e.bob, "POST", "/v1/boxes/"+bobs[0].ID+"/exec", map[string]any{"cmd": []string{"true"}}); st != 200 {
		t.Errorf("bob's exec while alice's runs: %d %s, want 200", st, body)
	}
	_, body := e.call(e.alice, "GET", "/v1/boxes/"+c.ID+"/execs", nil)
	var l server.ExecList
	json.Unmarshal(body, &l)
	for _, x := range l.Execs {
		e.call(e.alice, "DELETE", "/v1/boxes/"+c.ID+"/execs/"+x.ID, nil)
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the killed exec did not return")
	}
	// Snapshots: one for alice; bob does not see it, nor restore from it.
	if st, body := e.call(e.alice, "POST", "/v1/boxes/"+c.ID+"/snapshot", map[string]any{"name": "s1"}); st != 201 {
		t.Fatalf("alice's snapshot: %d %s", st, body)
	}
	if st, body := e.call(e.alice, "POST", "/v1/boxes/"+c.ID+"/snapshot", map[string]any{"name": "s2"}); st != 403 || !strings.Contains(string(body), server.CodeQuotaExceeded) {
		t.Errorf("alice's second snapshot: %d %s, want 403 quota_exceeded", st, body)
	}
	var sl server.SnapshotList
	_, body = e.call(e.alice, "GET", "/v1/snapshots", nil)
	json.Unmarshal(body, &sl)
	if len(sl.Snapshots) != 1 || sl.Snapshots[0].Name != "s1" {
		t.Errorf("alice's snapshots: %s, want s1", body)
	}
	_, body = e.call(e.bob, "GET", "/v1/snapshots", nil)
	if json.Unmarshal(body, &sl); len(sl.Snapshots) != 0 {
		t.Errorf("bob's snapshots: %s, want none", body)
	}
	for _, c := range []struct{ method, path string }{{"GET", "/v1/snapshots/s1"}, {"DELETE", "/v1/snapshots/s1"}} {
		if st, body := e.call(e.bob, c.method, c.path, nil); st != 404 || !strings.Contains(string(body), server.CodeSnapshotNotFound) {
			t.Errorf("bob %s %s: %d %s, want 404", c.method, c.path, st, body)
		}
	}
	if st, _, p := e.create(e.bob, map[string]any{"from_snapshot": "s1", "image": ""}); st != 404 || p.Code != server.CodeSnapshotNotFound || strings.Contains(p.Detail, "bob.") {
		t.Errorf("bob restores alice's snapshot: %d %+v, want 404 snapshot_not_found", st, p)
	}
	// The audit log names the tenant of every line.
	raw, err := os.ReadFile(e.audit)
	if err != nil {
		t.Fatal(err)
	}
	tenants := map[string]int{}
	for line := range strings.Lines(string(raw)) {
		var ae server.AuditEntry
		if err := json.Unmarshal([]byte(line), &ae); err != nil {
			t.Fatal(err)
		}
		tenants[ae.Tenant]++
	}
	if tenants["alice"] == 0 || tenants["bob"] == 0 || len(tenants) != 2 {
		t.Errorf("audit lines by tenant: %v, want alice's and bob's only", tenants)
	}
}

// TestTenantsEventsAndMetrics: a tenant's event stream carries only its
// own boxes' events; /metrics is the admin's.
func TestTenantsEventsAndMetrics(t *testing.T) {
	e := newTenantEnv(t, tenant.Quota{})
	type stream struct {
		mu  sync.Mutex
		evs []server.Event
	}
	sub := func(token string) *stream {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/events", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		s := &stream{}
		open := make(chan struct{})
		go func() {
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok {
					continue
				}
				var ev server.Event
				json.Unmarshal([]byte(data), &ev)
				if ev.Type == server.EventStreamOpen {
					close(open)
					continue
				}
				s.mu.Lock()
				s.evs = append(s.evs, ev)
				s.mu.Unlock()
			}
		}()
		select {
		case <-open:
		case <-time.After(30 * time.Second):
			t.Fatal("event stream did not open")
		}
		return s
	}
	alice, bob, admin := sub(e.alice), sub(e.bob), sub(e.admin)
	st, a, p := e.create(e.alice, nil)
	if st != 201 {
		t.Fatalf("alice create: %d %+v", st, p)
	}
	st, b, p := e.create(e.bob, nil)
	if st != 201 {
		t.Fatalf("bob create: %d %+v", st, p)
	}
	e.call(e.alice, "POST", "/v1/boxes/"+a.ID+"/exec", map[string]any{"cmd": []string{"true"}})
	if st, body := e.call(e.alice, "DELETE", "/v1/boxes/"+a.ID+"?force=true", nil); st != 204 {
		t.Fatalf("remove: %d %s", st, body)
	}
	// The admin sees both boxes' events; once it has alice's removal,
	// every stream has had the events before it (one bus, in order).
	deadline := time.Now().Add(30 * time.Second)
	for {
		admin.mu.Lock()
		done := slices.ContainsFunc(admin.evs, func(ev server.Event) bool { return ev.BoxID == a.ID && ev.Type == server.EventBoxRemoved })
		admin.mu.Unlock()
		alice.mu.Lock()
		done = done && slices.ContainsFunc(alice.evs, func(ev server.Event) bool { return ev.Type == server.EventBoxRemoved })
		alice.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no box.removed event for alice's box on the admin's and alice's streams: admin %+v alice %+v", admin.evs, alice.evs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for name, c := range map[string]struct {
		s          *stream
		own, other string
	}{"alice": {alice, a.ID, b.ID}, "bob": {bob, b.ID, a.ID}} {
		c.s.mu.Lock()
		var own int
		for _, ev := range c.s.evs {
			if ev.BoxID == c.other {
				t.Errorf("%s's stream carries %s of the other tenant's box", name, ev.Type)
			}
			if ev.BoxID == c.own {
				own++
			}
		}
		c.s.mu.Unlock()
		if name == "alice" && own < 3 {
			t.Errorf("alice's stream has %d events of her box, want created, exec and removed", own)
		}
	}
	if st, _ := e.call(e.bob, "GET", "/metrics", nil); st != 403 {
		t.Errorf("bob GET /metrics: %d, want 403", st)
	}
	if st, _ := e.call(e.admin, "GET", "/metrics", nil); st != 200 {
		t.Errorf("admin GET /metrics: %d, want 200", st)
	}
}

// TestTenantsReload: tokens are added and revoked by editing the file,
// without a restart (Set.Watch notices the change).
func TestTenantsReload(t *testing.T) {
	open, _ := lifeHome(t)
	r := open(0)
	file := filepath.Join(t.TempDir(), "tenants.json")
	bob := tenant.NewToken()
	if err := tenant.Add(file, tenant.Tenant{Name: "bob"}, bob); err != nil {
		t.Fatal(err)
	}
	set, err := tenant.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan struct{}, 1)
	go set.Watch(ctx, hup, nil)
	ts := httptest.NewServer(server.New(server.Config{Runtime: r, Token: adminToken, Tenants: set}).Handler(true))
	defer ts.Close()
	status := func(token string) int {
		req, _ := http.NewRequest("GET", ts.URL+"/v1/boxes", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	carol := tenant.NewToken()
	if st := status(carol); st != 401 {
		t.Fatalf("carol before she is added: %d, want 401", st)
	}
	if err := tenant.Add(file, tenant.Tenant{Name: "carol"}, carol); err != nil {
		t.Fatal(err)
	}
	eventually("carol's token works once added", func() bool { return status(carol) == 200 })
	if err := tenant.Remove(file, "bob"); err != nil {
		t.Fatal(err)
	}
	eventually("bob's token is refused once removed", func() bool { return status(bob) == 401 })
	// A broken file keeps the tenants loaded before; a SIGHUP-like
	// reload of a fixed one takes it.
	if err := os.WriteFile(file, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup <- struct{}{}
	if st := status(carol); st != 200 {
		t.Errorf("carol after a broken file: %d, want 200 (the previous tenants stay)", st)
	}
	if st := status(adminToken); st != 200 {
		t.Errorf("the admin token: %d, want 200", st)
	}
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// TestTenantsMCP: an MCP session is its opener's: its box is made as the
// tenant's (CheckBox sees the tenant and labels the box), and another
// tenant's request on its session id is 404.
func TestTenantsMCP(t *testing.T) {
	open, _ := snapshottingHome(t)
	r := open(0)
	file := filepath.Join(t.TempDir(), "tenants.json")
	alice, bob := tenant.NewToken(), tenant.NewToken()
	for name, tok := range map[string]string{"alice": alice, "bob": bob} {
		if err := tenant.Add(file, tenant.Tenant{Name: name}, tok); err != nil {
			t.Fatal(err)
		}
	}
	set, err := tenant.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	var srv *server.Server
	type seen struct{ tenant, label string }
	got := make(chan seen, 4)
	ms := mcpserver.New(r, mcpserver.Options{Version: "test",
		CheckBox: func(ctx context.Context, o *airlock.BoxOptions) (func(), error) {
			release, err := srv.CheckBox(ctx, o)
			if err != nil {
				return nil, err
			}
			release()
			got <- seen{server.TenantName(ctx), o.Labels[server.TenantLabel]}
			return nil, errors.New("test: no box")
		}})
	defer ms.Close()
	srv = server.New(server.Config{Runtime: r, Token: adminToken, Tenants: set, MCP: ms.HTTPHandler()})
	ts := httptest.NewServer(srv.Handler(true))
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{alice, http.DefaultTransport}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError {
		t.Errorf("the tool call made a box: %+v", res)
	}
	select {
	case s := <-got:
		if s.tenant != "alice" || s.label != "alice" {
			t.Errorf("alice's session box: checked as tenant %q, labelled %q; want alice's", s.tenant, s.label)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("CheckBox was not called")
	}
	// Bob on alice's session: 404, as a session that does not exist.
	for _, tok := range []string{bob} {
		body := `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`
		req, _ := http.NewRequest("POST", ts.URL+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", cs.ID())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("bob on alice's MCP session: %d, want 404", resp.StatusCode)
		}
	}
	// Alice's session still answers her.
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Errorf("alice's session after bob's try: %v", err)
	}
}

// TestTenantsCheckpointsInDiskQuota: a tenant's checkpoints count in its
// disk quota by the bytes they take: once its disks and checkpoints reach
// it, a checkpoint and a create are refused (403 quota_exceeded), and
// removing checkpoints makes room again.
func TestTenantsCheckpointsInDiskQuota(t *testing.T) {
	e := newTenantEnv(t, tenant.Quota{DiskMiB: 100})
	st, b, p := e.create(e.alice, map[string]any{"disk_size_mib": 32})
	if st != 201 {
		t.Fatalf("alice's box: %d %+v", st, p)
	}
	dir := fake.FilesDir(filepath.Join(e.r.Home(), "boxes", b.ID))
	if st, body := e.call(e.alice, "POST", "/v1/boxes/"+b.ID+"/exec", map[string]any{"cmd": []string{"sh", "-c", `head -c 40000000 /dev/urandom > "$F/big"`}, "env": map[string]string{"F": dir}}); st != 200 {
		t.Fatalf("write 40 MB: %d %s", st, body)
	}
	for _, name := range []string{"c1", "c2"} { // 32 + 40 MiB, then past 100
		if st, body := e.call(e.alice, "POST", "/v1/boxes/"+b.ID+"/checkpoints", map[string]any{"name": name}); st != 201 {
			t.Fatalf("checkpoint %s: %d %s", name, st, body)
		}
	}
	if st, body := e.call(e.alice, "POST", "/v1/boxes/"+b.ID+"/checkpoints", map[string]any{"name": "c3"}); st != 403 || !strings.Contains(string(body), server.CodeQuotaExceeded) {
		t.Errorf("a checkpoint past the disk quota: %d %s, want 403 quota_exceeded", st, body)
	}
	if st, _, p := e.create(e.alice, map[string]any{"disk_size_mib": 16}); st != 403 || p.Code != server.CodeQuotaExceeded || !strings.Contains(p.Detail, "disk") {
		t.Errorf("a box past the disk quota its checkpoints fill: %d %+v, want 403 quota_exceeded naming disk", st, p)
	}
	for _, name := range []string{"c1", "c2"} {
		if st, body := e.call(e.alice, "DELETE", "/v1/boxes/"+b.ID+"/checkpoints/"+name, nil); st != 204 && st != 200 {
			t.Fatalf("remove checkpoint %s: %d %s", name, st, body)
		}
	}
	if st, _, p := e.create(e.alice, map[string]any{"disk_size_mib": 16}); st != 201 {
		t.Errorf("a box once the checkpoints are gone: %d %+v", st, p)
	}
}
