package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/airlock-run/airlock/internal/kubebox"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/vmtest"
)

func TestMain(m *testing.M) {
	done, err := vmtest.Isolate()
	if err != nil {
		panic(err)
	}
	code := m.Run()
	if err := done(); err != nil && code == 0 {
		code = 1
	}
	os.Exit(code)
}

// gatewayOn serves a Gateway over client as airlock gateway does, with
// token "t".
func gatewayOn(t *testing.T, objs ...any) (*httptest.Server, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Node:
			_, err = client.CoreV1().Nodes().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = client.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	g, err := New(Config{Client: client, NodeToken: "node"})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	t.Cleanup(func() { cancel(); g.Close() })
	if err := g.Start(sctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(server.New(server.Config{Cluster: g, Token: "t"}).Handler(true))
	t.Cleanup(hs.Close)
	return hs, client
}

func do(t *testing.T, method, url string, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer t")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestGatewaySpec: the gateway serves airlock serve's OpenAPI document
// (the same Go types: not a copy), its auth and its problems.
func TestGatewaySpec(t *testing.T) {
	hs, _ := gatewayOn(t)
	code, got := do(t, "GET", hs.URL+"/openapi.json", "")
	want, err := server.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	json.Compact(&a, []byte(got))
	json.Compact(&b, want)
	if code != 200 || a.String() != b.String() {
		t.Fatalf("/openapi.json: %d, differs from server.OpenAPI()", code)
	}
	req, _ := http.NewRequest("GET", hs.URL+"/v1/boxes", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("no token: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if code, body := do(t, "GET", hs.URL+"/v1/images", ""); code != 501 || !strings.Contains(body, `"not_supported"`) {
		t.Errorf("/v1/images: %d %s", code, body)
	}
	// Snapshots are the nodes' (none here).
	if code, body := do(t, "GET", hs.URL+"/v1/snapshots", ""); code != 200 || !strings.Contains(body, `"snapshots":[]`) {
		t.Errorf("/v1/snapshots: %d %s", code, body)
	}
	if code, body := do(t, "GET", hs.URL+"/v1/snapshots/s1", ""); code != 404 || !strings.Contains(body, `"snapshot_not_found"`) {
		t.Errorf("/v1/snapshots/s1: %d %s", code, body)
	}
	if code, body := do(t, "GET", hs.URL+"/v1/boxes/0123456789ab", ""); code != 404 || !strings.Contains(body, `"box_not_found"`) {
		t.Errorf("unknown box: %d %s", code, body)
	}
	if code, body := do(t, "POST", hs.URL+"/v1/boxes/nosuch/exec", `{"cmd":["true"]}`); code != 404 || !strings.Contains(body, `"box_not_found"`) {
		t.Errorf("exec in an unknown box: %d %s", code, body)
	}
	if code, body := do(t, "GET", hs.URL+"/v1/boxes/x/files/..%2F..%2Fimages", ""); code != 400 || !strings.Contains(body, "not clean") {
		t.Errorf("a path out of the box: %d %s", code, body)
	}
}

// TestGatewayCreateRefusals: what a pod cannot carry is refused before
// any pod is made, with a reason.
func TestGatewayCreateRefusals(t *testing.T) {
	hs, client := gatewayOn(t)
	for body, want := range map[string]string{
		`{"image":"x","ports":[{"host_port":0,"guest_port":80}]}`:        "--allow-publish",
		`{"from_snapshot":"s1"}`:                                         "snapshot_not_found",
		`{"image":"x","labels":{"bad key!":"v"}}`:                        "not a valid Kubernetes label key",
		`{"image":"x","labels":{"k":"` + strings.Repeat("v", 64) + `"}}`: "not a valid Kubernetes label value",
		`{"image":"x","labels":{"airlock.dev/box-id":"v"}}`:              "airlock's own",
		`{"image":"x","name":"has space"}`:                               "Kubernetes label value",
	} {
		code, got := do(t, "POST", hs.URL+"/v1/boxes", body)
		if code/100 != 4 && code != 501 || !strings.Contains(got, want) {
			t.Errorf("create %s: %d %s, want %q", body, code, got, want)
		}
	}
	pods, _ := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	if len(pods.Items) != 0 {
		t.Fatalf("%d pods made by refused creates", len(pods.Items))
	}
}

// TestGatewayPodMapping: a create's pod (runtime class, resources from
// size, options annotation, labels) and a list from pods: a pod on a
// NotReady node is lost, one without a node is created.
func TestGatewayPodMapping(t *testing.T) {
	g := &Gateway{cfg: Config{Namespace: "ns"}}
	pod, err := g.podOf("0123456789ab", server.BoxSpec{Image: "python:slim", Name: "n", CPUs: 2, MemoryMiB: 1024,
		Env: server.EnvList{"A=1"}, Network: "none", Lease: 30, Labels: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if pod.Name != "box-0123456789ab" || *pod.Spec.RuntimeClassName != "airlock" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever ||
		c.Resources.Requests.Cpu().Value() != 2 || c.Resources.Limits.Memory().Value() != 1024<<20 || c.Env[0].Name != "A" ||
		pod.Labels[kubebox.IDLabel] != "0123456789ab" || pod.Labels[kubebox.NameLabel] != "n" || pod.Labels["team"] != "a" {
		t.Fatalf("pod: %+v", pod)
	}
	o, err := kubebox.ParseOptions(pod.Annotations[kubebox.OptionsAnnotation])
	if err != nil || o.Network != "none" || o.Lease != 30 {
		t.Fatalf("options %+v, %v", o, err)
	}
	// Ports, volumes and secrets go to the node in the annotation; a
	// secret's value only in the Secret, which the pod owns.
	sp := server.BoxSpec{Image: "x", Ports: []server.PortSpec{{HostIP: "127.0.0.1", GuestPort: 8000}},
		Volumes: []server.VolumeSpec{{Source: "data", Target: "/data"}},
		Secrets: map[string]server.SecretSpec{"TOKEN": {Value: "sk-hidden", Hosts: []string{"api.example.com"}}}}
	sec, err := g.podOf("0123456789ac", sp)
	if err != nil {
		t.Fatal(err)
	}
	o, err = kubebox.ParseOptions(sec.Annotations[kubebox.OptionsAnnotation])
	if err != nil || len(o.Ports) != 1 || o.Ports[0].GuestPort != 8000 || len(o.Volumes) != 1 || o.Volumes[0].Target != "/data" ||
		o.SecretsFrom != "box-0123456789ac" || o.Secrets["TOKEN"].Hosts[0] != "api.example.com" {
		t.Fatalf("options %+v, %v", o, err)
	}
	if j, _ := json.Marshal(sec); strings.Contains(string(j), "sk-hidden") {
		t.Fatalf("a secret's value in the pod: %s", j)
	}
	sec.UID = "uid-1"
	if s := secretOf(sec, sp); s == nil || string(s.Data["TOKEN"]) != "sk-hidden" || s.Name != sec.Name || s.OwnerReferences[0].UID != "uid-1" {
		t.Fatalf("secret %+v", s)
	}
	pinned(sec, "n7")
	if pinnedTo(sec) != "n7" {
		t.Fatalf("pinned: %+v", sec.Spec.Affinity)
	}

	notReady := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2", Annotations: map[string]string{kubebox.APIAnnotation: "http://127.0.0.1:1"}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status."}}}}
	onLost := pod.DeepCopy()
	onLost.Namespace, onLost.Spec.NodeName, onLost.Status.Phase = "default", "n2", corev1.PodRunning
	pending := pod.DeepCopy()
	pending.Namespace, pending.Name, pending.Labels[kubebox.IDLabel], pending.Labels[kubebox.NameLabel] = "default", "box-ba9876543210", "ba9876543210", "m"
	pending.CreationTimestamp = metav1.NewTime(time.Now().Add(time.Hour))
	hs, _ := gatewayOn(t, notReady, onLost, pending)
	code, body := do(t, "GET", hs.URL+"/v1/boxes", "")
	var list server.BoxList
	json.Unmarshal([]byte(body), &list)
	if code != 200 || len(list.Boxes) != 2 {
		t.Fatalf("list: %d %s", code, body)
	}
	for _, b := range list.Boxes {
		want := map[string]string{"0123456789ab": server.BoxLost, "ba9876543210": "created"}[b.ID]
		if b.State != want || b.CPUs != 2 || b.MemoryMiB != 1024 || b.Network != "none" || b.Labels["team"] != "a" {
			t.Errorf("box %+v, want state %s", b, want)
		}
	}
	code, body = do(t, "POST", hs.URL+"/v1/boxes/n/exec", `{"cmd":["true"]}`)
	if code != 409 || !strings.Contains(body, `"box_lost"`) || !strings.Contains(body, "node n2 is NotReady") {
		t.Fatalf("exec on a NotReady node: %d %s", code, body)
	}
	code, body = do(t, "POST", hs.URL+"/v1/boxes/m/exec", `{"cmd":["true"]}`)
	if code != 409 || !strings.Contains(body, `"box_not_running"`) {
		t.Fatalf("exec in a pending box: %d %s", code, body)
	}
}
