package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/airlock-run/airlock/internal/kubebox"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/tenant"
)

// fakeNode serves the node API a gateway calls (GET a box, POST exec),
// with node token "node".
func fakeNode(t *testing.T) *httptest.Server {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer node" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		rest, ok := strings.CutPrefix(r.URL.Path, "/v1/boxes/"+kubebox.BoxNamePrefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		uid, what, _ := strings.Cut(rest, "/")
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "GET" && what == "":
			json.NewEncoder(w).Encode(server.Box{ID: kubebox.BoxName(uid), State: "running"})
		case r.Method == "POST" && what == "stop":
			json.NewEncoder(w).Encode(server.Box{ID: kubebox.BoxName(uid), State: "stopped"})
		case r.Method == "POST" && what == "exec":
			fmt.Fprint(w, `{"exit_code":3,"stdout":"hi\n","stdout_encoding":"utf-8","stderr":"","stderr_encoding":"utf-8","timed_out":false,"truncated":false,"duration_ms":1}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(hs.Close)
	return hs
}

// kubelet plays the scheduler and the node for the fake clientset: every
// pod without a node is put on n1 and Running, until the test ends.
func kubelet(t *testing.T, client *fake.Clientset) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			pods, _ := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
			for _, p := range pods.Items {
				if p.Spec.NodeName == "" {
					p.Spec.NodeName = "n1"
					p.Status.Phase = corev1.PodRunning
					client.CoreV1().Pods("default").Update(ctx, &p, metav1.UpdateOptions{})
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
}

// TestGatewayTenants: two tenants' tokens through the gateway see, list
// and touch only their own boxes (another's id is 404, the same name is
// no conflict), the admin sees both as TENANT.NAME; a tenant's box quota
// is enforced from the pods, also by a gateway whose cache has not seen
// the tenant's pods (another gateway's creates); the audit line of an
// exec names the tenant; an auto_remove box stopped is removed; a fork
// from a checkpoint says what to use instead.
func TestGatewayTenants(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tenants.json")
	for name, q := range map[string]tenant.Quota{"acme": {Boxes: 1}, "beta": {}} {
		if err := tenant.Add(file, tenant.Tenant{Name: name, Quota: q}, "tok-"+name); err != nil {
			t.Fatal(err)
		}
	}
	set, err := tenant.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	audit, err := server.OpenAuditLog(filepath.Join(dir, "audit.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer audit.Close()
	node := fakeNode(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{kubebox.APIAnnotation: node.URL}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
	kubelet(t, client)
	serve := func(start bool) string {
		g, err := New(Config{Client: client, NodeToken: "node", CreateTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(func() { cancel(); g.Close() })
		if start {
			if err := g.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		hs := httptest.NewServer(server.New(server.Config{Cluster: g, Token: "t", Tenants: set, Audit: audit, Metrics: server.NewMetrics("test")}).Handler(true))
		t.Cleanup(hs.Close)
		return hs.URL
	}
	url := serve(true)
	as := func(token, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	boxes := map[string]server.Box{}
	for _, who := range []string{"acme", "beta"} {
		code, body := as("tok-"+who, "POST", "/v1/boxes", `{"image":"x","name":"web","labels":{"team":"`+who+`"}}`)
		var b server.Box
		json.Unmarshal([]byte(body), &b)
		if code != 201 || b.Name != "web" || b.Labels[server.TenantLabel] != "" || b.Labels["team"] != who {
			t.Fatalf("%s creates web: %d %s", who, code, body)
		}
		boxes[who] = b
		pod, err := client.CoreV1().Pods("default").Get(context.Background(), "box-"+b.ID, metav1.GetOptions{})
		if err != nil || pod.Labels[kubebox.TenantLabel] != who || pod.Labels[kubebox.NameLabel] != "web" {
			t.Fatalf("%s's pod: %v %v", who, err, pod.Labels)
		}
	}
	for _, who := range []string{"acme", "beta"} {
		other := map[string]string{"acme": "beta", "beta": "acme"}[who]
		code, body := as("tok-"+who, "GET", "/v1/boxes", "")
		var list server.BoxList
		json.Unmarshal([]byte(body), &list)
		if code != 200 || len(list.Boxes) != 1 || list.Boxes[0].ID != boxes[who].ID || list.Boxes[0].Name != "web" {
			t.Fatalf("%s lists: %d %s", who, code, body)
		}
		if code, body := as("tok-"+who, "GET", "/v1/boxes/web", ""); code != 200 || !strings.Contains(body, boxes[who].ID) {
			t.Fatalf("%s gets web: %d %s", who, code, body)
		}
		for _, c := range [][2]string{{"GET", ""}, {"POST", "/exec"}, {"DELETE", "?force=true"}} {
			code, body := as("tok-"+who, c[0], "/v1/boxes/"+boxes[other].ID+c[1], map[string]string{"POST": `{"cmd":["true"]}`}[c[0]])
			if code != 404 || !strings.Contains(body, `"box_not_found"`) {
				t.Fatalf("%s: %s %s's box%s: %d %s", who, c[0], other, c[1], code, body)
			}
		}
	}
	code, body := as("t", "GET", "/v1/boxes", "")
	var all server.BoxList
	json.Unmarshal([]byte(body), &all)
	if code != 200 || len(all.Boxes) != 2 {
		t.Fatalf("admin lists: %d %s", code, body)
	}
	for _, b := range all.Boxes {
		who := b.Labels[server.TenantLabel]
		if b.Name != who+".web" || b.ID != boxes[who].ID {
			t.Fatalf("admin sees %+v", b)
		}
	}
	if code, body := as("t", "GET", "/v1/boxes/beta.web", ""); code != 200 || !strings.Contains(body, boxes["beta"].ID) {
		t.Fatalf("admin gets beta.web: %d %s", code, body)
	}
	if code, body := as("tok-acme", "POST", "/v1/boxes", `{"image":"x","labels":{"airlock.tenant":"beta"}}`); code != 400 {
		t.Fatalf("a tenant label from a client: %d %s", code, body)
	}

	// acme's quota: one box.
	code, body = as("tok-acme", "POST", "/v1/boxes", `{"image":"x"}`)
	if code != 403 || !strings.Contains(body, `"quota_exceeded"`) || !strings.Contains(body, "tenant acme") {
		t.Fatalf("acme's second box: %d %s", code, body)
	}
	// A gateway that has not listed the pods (as one whose cache lags
	// behind another's creates) refuses it too, once its pod exists, and
	// deletes that pod.
	url = serve(false)
	code, body = as("tok-acme", "POST", "/v1/boxes", `{"image":"x"}`)
	if code != 403 || !strings.Contains(body, `"quota_exceeded"`) {
		t.Fatalf("acme's second box through a gateway that listed nothing: %d %s", code, body)
	}
	pods, err := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 2 {
		t.Fatalf("pods after the refusals: %v %d", err, len(pods.Items))
	}
	// beta has no quota.
	if code, body := as("tok-beta", "POST", "/v1/boxes", `{"image":"x"}`); code != 201 {
		t.Fatalf("beta's second box: %d %s", code, body)
	}

	// An exec's audit line names the tenant.
	if code, body := as("tok-acme", "POST", "/v1/boxes/web/exec", `{"cmd":["echo","hi"]}`); code != 200 || !strings.Contains(body, `"exit_code":3`) {
		t.Fatalf("acme's exec: %d %s", code, body)
	}
	// Written once the answer is out: looked for until it is.
	var e server.AuditEntry
	var log []byte
	for end := time.Now().Add(20 * time.Second); e.Tenant == "" || e.BoxID != "web"; time.Sleep(20 * time.Millisecond) {
		log, _ = os.ReadFile(filepath.Join(dir, "audit.log"))
		lines := strings.Split(strings.TrimSpace(string(log)), "\n") // the refused calls above have theirs
		e = server.AuditEntry{}
		json.Unmarshal([]byte(lines[len(lines)-1]), &e)
		if time.Now().After(end) {
			t.Fatalf("no audit line for acme's exec in web: %s", log)
		}
	}
	if e.Tenant != "acme" || e.Kind != "exec" || strings.Join(e.Cmd, " ") != "echo hi" || e.ExitCode == nil || *e.ExitCode != 3 || e.Client != "tenant:acme" {
		t.Fatalf("audit: %s", log)
	}

	// The gateway's metrics count the creates and execs it passed on.
	if code, body := as("t", "GET", "/metrics", ""); code != 200 || !strings.Contains(body, `airlock_execs_total{result="ok"} 1`) ||
		!strings.Contains(body, `airlock_box_starts_total{result="ok"} 1`) {
		t.Fatalf("metrics: %d %s", code, body)
	}

	// An auto_remove box stopped through the gateway is removed.
	code, body = as("tok-beta", "POST", "/v1/boxes", `{"image":"x","name":"once","auto_remove":true}`)
	if code != 201 {
		t.Fatalf("beta's auto_remove box: %d %s", code, body)
	}
	if code, body := as("tok-beta", "POST", "/v1/boxes/once/stop", ""); code != 200 || !strings.Contains(body, `"stopped"`) || !strings.Contains(body, `"name":"once"`) || !strings.Contains(body, `"auto_remove":true`) || strings.Contains(body, "airlock.tenant") {
		t.Fatalf("stop an auto_remove box: %d %s", code, body)
	}
	if code, body := as("tok-beta", "GET", "/v1/boxes/once", ""); code != 404 {
		t.Fatalf("an auto_remove box after its stop: %d %s", code, body)
	}

	// A fork from a checkpoint is refused with its reason; a snapshot
	// may not take a fork's name.
	if code, body := as("tok-beta", "POST", "/v1/boxes/web/fork", `{"from_checkpoint":"c1"}`); code != 501 || !strings.Contains(body, `"not_supported"`) || !strings.Contains(body, "rollback") {
		t.Fatalf("fork from a checkpoint through the gateway: %d %s", code, body)
	}
	if code, body := as("tok-beta", "POST", "/v1/boxes/web/snapshot", `{"name":"airlock-fork-1"}`); code != 400 || !strings.Contains(body, "gateway's own") {
		t.Fatalf("snapshot named as a fork's: %d %s", code, body)
	}
}
