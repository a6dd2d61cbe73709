package airlock_test

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/gateway"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/tenant"
	"github.com/airlock-run/airlock/kubenode"
	"github.com/coder/websocket"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// gwNode is an airlock node of the gateway test: kubenode.Run with the
// node's airlock API (internal/server on its Runtime, with the node
// token) on a loopback port.
type gwNode struct {
	name string
	api  string // the node's airlock API (http://127.0.0.1:PORT)
	rt   *airlock.Runtime
	stop func() // stops the node and its API (its boxes keep running)
}

// startAPINode runs airlock node NAME on rt with its API, as airlock node
// --api-listen does, and its kubelet API (the cluster's node pair, as
// startNode), and waits until it is Ready.
func (c *kubeCluster) startAPINode(rt *airlock.Runtime, name, nodeToken string) *gwNode {
	c.t.Helper()
	return c.startAPINodeWith(rt, name, nodeToken, nil, nil)
}

// startAPINodeWith is startAPINode whose API streams the events of ev
// (the Runtime's observer; nil: none) and whose boxes may attach host
// directories under volumes (airlock node --allow-volume).
func (c *kubeCluster) startAPINodeWith(rt *airlock.Runtime, name, nodeToken string, ev *server.Events, volumes []string) *gwNode {
	t := c.t
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		server.New(server.Config{Runtime: rt, Token: nodeToken, DrainTimeout: 5 * time.Second, Events: ev}).Serve(ctx, l)
	}()
	ready := make(chan struct{})
	done := make(chan error, 1)
	pki := filepath.Join(c.dir, "pki") // the kubelet API's pair, so that kubectl exec reaches the node
	go func() {
		done <- kubenode.Run(ctx, kubenode.Config{Name: name, Client: c.client, Runtime: rt, Logf: t.Logf,
			Ready: func() { close(ready) }, KubeletAddr: "127.0.0.1:0", APIAddr: l.Addr().String(), AllowVolumeDirs: volumes,
			TLSCertFile: filepath.Join(pki, "node.crt"), TLSKeyFile: filepath.Join(pki, "node.key"), ClientCAFile: filepath.Join(pki, "ca.crt")})
	}()
	stopped := false
	n := &gwNode{name: name, rt: rt, api: "http://" + l.Addr().String()}
	n.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kubenode.Run %s: %v", name, err)
		}
		<-served
	}
	t.Cleanup(func() {
		n.stop()
		boxes, _ := rt.List(context.Background())
		for _, b := range boxes {
			if strings.HasPrefix(b.Name, kubenode.BoxNamePrefix) {
				rt.Remove(context.Background(), b.ID, true)
			}
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("kubenode.Run %s: %v", name, err)
	case <-time.After(60 * time.Second):
		t.Fatalf("node %s was not Ready within 60 s", name)
	}
	return n
}

// startGateway runs an airlock gateway on the cluster (as airlock gateway
// does; tenants may be nil) and returns its URL and a stop function.
func (c *kubeCluster) startGateway(token, nodeToken string, tenants *tenant.Set) (url string, stop func()) {
	c.t.Helper()
	return c.startGatewayWith(token, nodeToken, tenants, server.Policy{})
}

// startGatewayWith is startGateway with policy (airlock gateway
// --allow-publish, --allow-host-port); its /v1/events follows the nodes'.
func (c *kubeCluster) startGatewayWith(token, nodeToken string, tenants *tenant.Set, policy server.Policy) (url string, stop func()) {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	gw, err := gateway.New(gateway.Config{Client: c.client, NodeToken: nodeToken, CreateTimeout: 90 * time.Second, RemoveTimeout: 60 * time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		server.New(server.Config{Cluster: gw, Token: token, Tenants: tenants, DrainTimeout: 5 * time.Second,
			Metrics: server.NewMetrics(server.Version()), Events: server.NewEvents(), Policy: policy}).Serve(ctx, l)
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-served
			gw.Close()
		}
	}
	t.Cleanup(stop)
	return "http://" + l.Addr().String(), stop
}

// call makes an API call with the token and returns the status and body.
func call(t *testing.T, method, url, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if _, ok := body.([]byte); !ok && body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return v
}

// TestKubeGateway runs a loopback control plane with two airlock nodes
// (fake driver), each serving airlock's API for its boxes, and airlock
// gateways in front: two tenants' tokens see, list and touch only their
// own boxes and one's quota of boxes holds; boxes made through one
// gateway land on both nodes (each box asks for all of a node's CPUs);
// exec, files and the exec WebSocket go through either gateway to the
// box's node, 50 MiB of output streamed with every byte checked; the list shows
// both with their labels; a third box is refused with the scheduler's
// Unschedulable message; a restarted gateway answers for the boxes; a
// stopped node's box is lost (state lost, calls box_lost naming the node);
// removing boxes removes their pods and, on a live node, their box.
func TestKubeGateway(t *testing.T) {
	c := kubeStart(t)
	const token, nodeToken = "user-token", "node-token"
	ev1, ev2 := server.NewEvents(), server.NewEvents()
	n1 := c.startAPINodeWith(kubeSnapRuntimeObs(t, ev1), "airlock-gw-1", nodeToken, ev1, nil)
	n2 := c.startAPINodeWith(kubeSnapRuntimeObs(t, ev2), "airlock-gw-2", nodeToken, ev2, nil)
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	tenants := kubeTenants(t)
	grant, err := server.ParsePublishGrant("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	policy := server.Policy{AllowPublish: []server.PublishGrant{grant}}
	g1, stop1 := c.startGatewayWith(token, nodeToken, tenants, policy)
	g2, _ := c.startGatewayWith(token, nodeToken, tenants, policy)

	// The gateway's spec is airlock serve's.
	code, spec := call(t, "GET", g1+"/openapi.json", token, nil)
	want, err := server.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	json.Unmarshal(spec, &a)
	json.Unmarshal(want, &b)
	if code != 200 || fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("gateway /openapi.json (%d) differs from airlock serve's", code)
	}
	if code, body := call(t, "GET", g1+"/v1/boxes", "wrong", nil); code != 401 || !strings.Contains(string(body), `"unauthorized"`) {
		t.Fatalf("wrong token: %d %s", code, body)
	}

	// The Python SDK, unchanged, pointed at the gateway.
	pythonSDK(t, g1, token)

	t.Run("scale-to-zero", func(t *testing.T) { gwScaleToZero(t, c, g1, g2, token, n1, n2) })

	t.Run("node-features", func(t *testing.T) { gwNodeFeatures(t, c, g1, g2, token) })

	// Two tenants: each sees, lists and touches only its own boxes, on
	// either gateway; red's quota of one box holds.
	tenantBoxes := map[string]server.Box{}
	for i, who := range []string{"red", "blue"} {
		code, body := call(t, "POST", []string{g1, g2}[i]+"/v1/boxes", "tok-"+who, map[string]any{"image": kubeRef, "name": "mine"})
		if code != 201 {
			t.Fatalf("%s creates a box: %d %s", who, code, body)
		}
		tenantBoxes[who] = decode[server.Box](t, body)
	}
	for i, who := range []string{"red", "blue"} {
		other := tenantBoxes[[]string{"blue", "red"}[i]]
		g := []string{g2, g1}[i] // not the gateway that made it
		code, body := call(t, "GET", g+"/v1/boxes", "tok-"+who, nil)
		if list := decode[server.BoxList](t, body); code != 200 || len(list.Boxes) != 1 || list.Boxes[0].ID != tenantBoxes[who].ID || list.Boxes[0].Name != "mine" {
			t.Fatalf("%s lists: %d %s", who, code, body)
		}
		code, body = call(t, "POST", g+"/v1/boxes/mine/exec", "tok-"+who, map[string]any{"cmd": []string{"echo", who}})
		if res := decode[server.ExecResult](t, body); code != 200 || res.Stdout != who+"\n" {
			t.Fatalf("%s execs in its box: %d %s", who, code, body)
		}
		for _, path := range []string{"", "/exec"} {
			method := map[string]string{"": "GET", "/exec": "POST"}[path]
			code, body := call(t, method, g+"/v1/boxes/"+other.ID+path, "tok-"+who, map[string]any{"cmd": []string{"true"}})
			if code != 404 || !strings.Contains(string(body), `"box_not_found"`) {
				t.Fatalf("%s: %s another tenant's box%s: %d %s", who, method, path, code, body)
			}
		}
	}
	code, body := call(t, "POST", g2+"/v1/boxes", "tok-red", map[string]any{"image": kubeRef})
	if code != 403 || !strings.Contains(string(body), `"quota_exceeded"`) {
		t.Fatalf("red's second box: %d %s", code, body)
	}
	t.Run("tenant-snapshots", func(t *testing.T) { gwTenantSnapshots(t, g1, g2, token) })
	code, body = call(t, "GET", g1+"/v1/boxes", token, nil)
	if list := decode[server.BoxList](t, body); code != 200 || len(list.Boxes) != 2 {
		t.Fatalf("the admin lists the tenants' boxes: %d %s", code, body)
	}
	for who, bx := range tenantBoxes {
		if code, body := call(t, "DELETE", g1+"/v1/boxes/"+bx.ID+"?force=true", "tok-"+who, nil); code != 204 {
			t.Fatalf("%s removes its box: %d %s", who, code, body)
		}
	}

	cpus := runtime.NumCPU() // a node's capacity: one box per node
	mk := func(g, name string) server.Box {
		t.Helper()
		code, body := call(t, "POST", g+"/v1/boxes", token, map[string]any{"image": kubeRef, "name": name, "cpus": cpus,
			"labels": map[string]string{"team": "a", "box": name}})
		if code != 201 {
			t.Fatalf("create %s: %d %s", name, code, body)
		}
		return decode[server.Box](t, body)
	}
	boxA := mk(g1, "alpha")
	boxB := mk(g2, "beta")
	if boxA.State != "running" || boxB.State != "running" || boxA.Node == "" || boxB.Node == "" || boxA.Node == boxB.Node {
		t.Fatalf("boxes: %+v\n%+v", boxA, boxB)
	}
	if len(boxA.ID) != 12 || boxA.Name != "alpha" || boxA.Labels["team"] != "a" {
		t.Fatalf("box A: %+v", boxA)
	}

	// The third finds no node with the CPUs.
	code, body = call(t, "POST", g1+"/v1/boxes", token, map[string]any{"image": kubeRef, "cpus": cpus})
	if code != 409 || !strings.Contains(string(body), `"unschedulable"`) || !strings.Contains(string(body), "Insufficient cpu") {
		t.Fatalf("third box: %d %s", code, body)
	}
	eventually(t, 60*time.Second, func() string { // its pod is deleted
		pods, err := c.client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		if len(pods.Items) != 2 {
			return fmt.Sprintf("%d pods", len(pods.Items))
		}
		return ""
	})

	// A fork's children go to the node that holds the parent's snapshot:
	// A's node has no room for a child of A's size, and the scheduler's
	// refusal says so, naming the node.
	code, body = call(t, "POST", g2+"/v1/boxes/alpha/fork", token, map[string]any{"n": 1})
	if code != 409 || !strings.Contains(string(body), `"unschedulable"`) || !strings.Contains(string(body), "must run on node "+boxA.Node) {
		t.Fatalf("fork of a box on a full node: %d %s", code, body)
	}
	if code, body := call(t, "GET", g1+"/v1/snapshots", token, nil); code != 200 || strings.Contains(string(body), "airlock-fork") {
		t.Fatalf("a failed fork's snapshot is left: %d %s", code, body)
	}

	// Exec through the other gateway, by id and by name.
	for _, g := range []string{g1, g2} {
		for _, id := range []string{boxA.ID, "beta"} {
			code, body := call(t, "POST", g+"/v1/boxes/"+id+"/exec", token, map[string]any{"cmd": []string{"sh", "-c", "echo out-$0; echo err >&2; exit 4", id}})
			res := decode[server.ExecResult](t, body)
			if code != 200 || res.ExitCode != 4 || res.Stdout != "out-"+id+"\n" || res.Stderr != "err\n" {
				t.Fatalf("exec in %s via %s: %d %s", id, g, code, body)
			}
		}
	}
	// Files: written through one gateway, read through the other.
	if code, body := call(t, "PUT", g1+"/v1/boxes/"+boxB.ID+"/files?path=/tmp/hello.txt", token, []byte("through the gateway\n")); code/100 != 2 {
		t.Fatalf("write file: %d %s", code, body)
	}
	if code, body := call(t, "GET", g2+"/v1/boxes/beta/files?path=/tmp/hello.txt", token, nil); code != 200 || string(body) != "through the gateway\n" {
		t.Fatalf("read file: %d %q", code, body)
	}
	// The exec WebSocket, streamed through the gateway.
	wsExec(t, g2, token, boxA.ID)
	wsBig(t, g1, token, boxB.ID)

	// List and filters (pod labels).
	code, body = call(t, "GET", g2+"/v1/boxes?label=box=beta", token, nil)
	list := decode[server.BoxList](t, body)
	if code != 200 || len(list.Boxes) != 1 || list.Boxes[0].ID != boxB.ID || list.Boxes[0].Node != boxB.Node {
		t.Fatalf("list box=beta: %d %s", code, body)
	}
	code, body = call(t, "GET", g1+"/v1/boxes?label=team", token, nil)
	if list := decode[server.BoxList](t, body); code != 200 || len(list.Boxes) != 2 {
		t.Fatalf("list team: %d %s", code, body)
	}
	// Routes the gateway does not serve yet say so.
	if code, body := call(t, "GET", g1+"/v1/images", token, nil); code != 501 || !strings.Contains(string(body), `"not_supported"`) {
		t.Fatalf("images through the gateway: %d %s", code, body)
	}

	// A restarted gateway loses nothing.
	stop1()
	g3, _ := c.startGateway(token, nodeToken, tenants)
	code, body = call(t, "GET", g3+"/v1/boxes/alpha", token, nil)
	if got := decode[server.Box](t, body); code != 200 || got.ID != boxA.ID || got.State != "running" || got.Node != boxA.Node {
		t.Fatalf("box A after a gateway restart: %d %s", code, body)
	}
	if code, body := call(t, "POST", g3+"/v1/boxes/"+boxA.ID+"/exec", token, map[string]any{"cmd": []string{"true"}}); code != 200 {
		t.Fatalf("exec after a gateway restart: %d %s", code, body)
	}

	// A node that stops: its box is lost, never recreated.
	// The node stopped is the lost box's own: B's, or A's when A is on
	// n2 (the scheduler picks; this swap named the other node once, and
	// the live node answered the lost box's execs for the test's minute).
	lostNode, lostBox, liveBox, liveNode := n2, boxB, boxA, n1
	if boxA.Node == n2.name {
		lostBox, liveBox, lostNode, liveNode = boxA, boxB, n2, n1
	}
	if lostBox.Node != lostNode.name || liveBox.Node != liveNode.name {
		t.Fatalf("boxes on %s and %s, nodes %s and %s", lostBox.Node, liveBox.Node, lostNode.name, liveNode.name)
	}
	lostNode.stop()
	// A connection the gateway kept to the node may serve one more call;
	// the box is reported lost within the node's lease window.
	eventually(t, 60*time.Second, func() string {
		code, body := call(t, "POST", g3+"/v1/boxes/"+lostBox.ID+"/exec", token, map[string]any{"cmd": []string{"true"}})
		if code != 409 || !strings.Contains(string(body), `"box_lost"`) || !strings.Contains(string(body), lostNode.name) {
			return fmt.Sprintf("exec on a lost node: %d %s", code, body)
		}
		return ""
	})
	code, body = call(t, "GET", g3+"/v1/boxes/"+lostBox.ID, token, nil)
	if got := decode[server.Box](t, body); code != 200 || got.State != server.BoxLost || got.Node != lostNode.name {
		t.Fatalf("box on a lost node: %d %s", code, body)
	}
	code, body = call(t, "GET", g3+"/v1/boxes", token, nil)
	for _, bx := range decode[server.BoxList](t, body).Boxes {
		if want := map[bool]string{true: server.BoxLost, false: "running"}[bx.ID == lostBox.ID]; bx.State != want {
			t.Fatalf("list after the node stopped: %s is %s, want %s", bx.ID, bx.State, want)
		}
	}

	// Remove: the live node's box goes with its pod; the lost one's pod
	// is deleted at once.
	if code, body := call(t, "DELETE", g3+"/v1/boxes/"+liveBox.ID, token, nil); code != 409 || !strings.Contains(string(body), `"box_running"`) {
		t.Fatalf("remove without force: %d %s", code, body)
	}
	for _, bx := range []server.Box{liveBox, lostBox} {
		if code, body := call(t, "DELETE", g3+"/v1/boxes/"+bx.ID+"?force=true", token, nil); code != 204 {
			t.Fatalf("remove %s: %d %s", bx.ID, code, body)
		}
		if _, err := c.client.CoreV1().Pods("default").Get(context.Background(), "box-"+bx.ID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("pod of %s after remove: %v", bx.ID, err)
		}
	}
	boxes, err := liveNode.rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, bx := range boxes {
		if strings.HasPrefix(bx.Name, kubenode.BoxNamePrefix) {
			t.Fatalf("box %s left on node %s after its remove", bx.Name, liveNode.name)
		}
	}
	if code, body := call(t, "GET", g2+"/v1/boxes/"+liveBox.ID, token, nil); code != 404 || !strings.Contains(string(body), `"box_not_found"`) {
		t.Fatalf("removed box: %d %s", code, body)
	}
}

// wsExec runs a command over the exec WebSocket through the gateway at
// url and checks its output and exit frames.
func wsExec(t *testing.T, url, token, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http")+"/v1/boxes/"+id+"/exec/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		body := ""
		if resp != nil && resp.Body != nil {
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
		}
		t.Fatalf("exec WebSocket through the gateway: %v %s", err, body)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	req, _ := json.Marshal(map[string]any{"cmd": []string{"sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x; cat"}})
	if err := conn.Write(ctx, websocket.MessageText, req); err != nil {
		t.Fatal(err)
	}
	if err := conn.Write(ctx, websocket.MessageBinary, append([]byte{0}, "from stdin"...)); err != nil {
		t.Fatal(err)
	}
	if err := conn.Write(ctx, websocket.MessageText, []byte(`{"type":"close_stdin"}`)); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("exec WebSocket: %v (stdout so far %d bytes)", err, stdout.Len())
		}
		if typ == websocket.MessageBinary {
			if len(msg) > 0 && msg[0] == 1 {
				stdout.Write(msg[1:])
			}
			continue
		}
		var f struct {
			Type     string `json:"type"`
			ExitCode int    `json:"exit_code"`
		}
		json.Unmarshal(msg, &f)
		if f.Type == "exit" {
			want := strings.Repeat("x", 300000) + "from stdin"
			if f.ExitCode != 0 || stdout.String() != want {
				t.Fatalf("exec WebSocket: exit %d, stdout %d bytes (want %d)", f.ExitCode, stdout.Len(), len(want))
			}
			return
		}
		if f.Type == "error" {
			t.Fatalf("exec WebSocket: %s", msg)
		}
	}
}

// gwScaleToZero: scale to zero through the gateway. A box made with
// idle_timeout 1 and idle_action suspend is suspended on its node when
// idle (the gateway's GET shows it stopped and suspended) while its pod
// stays Running, its container running and never restarted, across two of
// the node's status resyncs. kubectl exec into the pod (the node's kubelet
// API) resumes it: while that exec runs, the gateway shows the box running
// and the pod is Running with restartCount 0. Idle again, it is suspended
// again, and an exec through the other gateway resumes it.
func gwScaleToZero(t *testing.T, c *kubeCluster, g1, g2, token string, nodes ...*gwNode) {
	ctx := context.Background()
	code, body := call(t, "POST", g1+"/v1/boxes", token, map[string]any{"image": kubeRef, "name": "sleepy",
		"idle_timeout": 1, "idle_action": "suspend"})
	if code != 201 {
		t.Fatalf("create an idle-suspend box: %d %s", code, body)
	}
	sleepy := decode[server.Box](t, body)
	t.Cleanup(func() {
		if code, body := call(t, "DELETE", g1+"/v1/boxes/"+sleepy.ID+"?force=true", token, nil); code != 204 && code != 404 {
			t.Errorf("remove sleepy: %d %s", code, body)
		}
	})
	podName := "box-" + sleepy.ID
	box := func(g string) (server.Box, string) {
		code, body := call(t, "GET", g+"/v1/boxes/sleepy", token, nil)
		if code != 200 {
			return server.Box{}, fmt.Sprintf("GET sleepy: %d %s", code, body)
		}
		return decode[server.Box](t, body), ""
	}
	suspended := func(g string) {
		t.Helper()
		eventually(t, 60*time.Second, func() string {
			b, why := box(g)
			if why == "" && (b.State != "stopped" || !b.Suspended) {
				why = fmt.Sprintf("box sleepy is %s (suspended %v), not suspended", b.State, b.Suspended)
			}
			return why
		})
	}
	// podRunning says why the pod is not Running with its container
	// running and never restarted ("" when it is).
	podRunning := func() string {
		pod, err := c.client.CoreV1().Pods("default").Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if pod.Status.Phase != corev1.PodRunning || len(pod.Status.ContainerStatuses) != 1 {
			return fmt.Sprintf("pod %s: phase %s, %d container statuses", podName, pod.Status.Phase, len(pod.Status.ContainerStatuses))
		}
		if cs := pod.Status.ContainerStatuses[0]; cs.State.Running == nil || cs.RestartCount != 0 {
			return fmt.Sprintf("pod %s: container state %+v, restartCount %d", podName, cs.State, cs.RestartCount)
		}
		return ""
	}

	suspended(g2)
	var node *gwNode
	for _, n := range nodes {
		if n.name == sleepy.Node {
			node = n
		}
	}
	if node == nil {
		t.Fatalf("box sleepy is on node %q, not one of the test's", sleepy.Node)
	}
	// On its node, the box's machine is gone, its memory on disk.
	pod, err := c.client.CoreV1().Pods("default").Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nb, err := node.rt.Get(ctx, kubenode.BoxName(pod.UID)); err != nil {
		t.Fatalf("the pod's box on node %s: %v", node.name, err)
	} else if info, err := nb.Info(ctx); err != nil || !info.Suspended || info.State == airlock.BoxRunning {
		t.Fatalf("the pod's box on node %s: %v, state %s, suspended %v", node.name, err, info.State, info.Suspended)
	}
	// Its pod runs on while the box is suspended: watched across two of
	// the node's status resyncs (kubenode's resyncInterval, 5 s).
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if why := podRunning(); why != "" {
			t.Fatalf("the suspended box's %s", why)
		}
	}

	// kubectl exec resumes it; the exec, in flight, keeps it in use.
	cmd := c.kubectlCmd("exec", "-i", podName, "--", "sh", "-c", "echo awake; cat >/dev/null; echo bye")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}()
	eventually(t, 90*time.Second, func() string {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("kubectl exec into the suspended box's pod ended before it answered: %v\n%s", err, out.String())
		default:
		}
		if got := out.String(); got != "awake\n" {
			return fmt.Sprintf("kubectl exec into the suspended box's pod: output %q", got)
		}
		return ""
	})
	if b, why := box(g1); why != "" || b.State != "running" || b.Suspended {
		t.Fatalf("box sleepy during an exec that resumed it: %s %+v", why, b)
	}
	if why := podRunning(); why != "" {
		t.Fatalf("the resumed box's %s", why)
	}
	stdin.Close()
	select {
	case err := <-exited:
		exited <- err
		if err != nil || out.String() != "awake\nbye\n" {
			t.Fatalf("kubectl exec: %v, output %q", err, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("kubectl exec did not end within 60 s of its stdin's end: output %q", out.String())
	}

	// Idle again: suspended again, and resumed by an exec through the
	// other gateway.
	suspended(g1)
	code, body = call(t, "POST", g2+"/v1/boxes/sleepy/exec", token, map[string]any{"cmd": []string{"echo", "awake"}})
	if res := decode[server.ExecResult](t, body); code != 200 || res.ExitCode != 0 || res.Stdout != "awake\n" {
		t.Fatalf("exec on a suspended box through the gateway: %d %s", code, body)
	}
	if why := podRunning(); why != "" {
		t.Fatalf("the box resumed through the gateway: %s", why)
	}
	if code, body := call(t, "DELETE", g1+"/v1/boxes/sleepy?force=true", token, nil); code != 204 {
		t.Fatalf("remove sleepy: %d %s", code, body)
	}
}

// gwNodeFeatures: a box made through gateway g1 with a published port
// and a secret gets them from its node (the port bound, the secret a
// placeholder in the box, its value in a Secret the pod owns, never in
// the pod); its snapshot stays on its node and is listed with it; a fork
// child and a restore run on that node; /v1/events shows the box's
// events with the gateway's id; the snapshot is removed through g2.
func gwNodeFeatures(t *testing.T, c *kubeCluster, g1, g2, token string) {
	ctx := context.Background()
	code, body := call(t, "POST", g1+"/v1/boxes", token, map[string]any{"image": kubeRef, "name": "feat",
		"ports":   []map[string]any{{"host_port": 0, "guest_port": 8000}},
		"secrets": map[string]any{"TOKEN": map[string]any{"value": "sk-gw-hidden", "hosts": []string{"api.example.com"}}}})
	if code != 201 {
		t.Fatalf("create with a port and a secret: %d %s", code, body)
	}
	feat := decode[server.Box](t, body)
	if len(feat.Ports) != 1 || feat.Ports[0].HostPort == 0 || feat.Ports[0].GuestPort != 8000 || len(feat.Secrets) != 1 || feat.Secrets[0].Name != "TOKEN" {
		t.Fatalf("box with a port and a secret: %s", body)
	}
	pod, err := c.client.CoreV1().Pods("default").Get(ctx, "box-"+feat.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if j, _ := json.Marshal(pod); strings.Contains(string(j), "sk-gw-hidden") {
		t.Fatalf("the secret's value is in the pod: %s", j)
	}
	sec, err := c.client.CoreV1().Secrets("default").Get(ctx, "box-"+feat.ID, metav1.GetOptions{})
	if err != nil || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != pod.UID {
		t.Fatalf("the box's Secret: %v %+v", err, sec)
	}
	code, body = call(t, "POST", g2+"/v1/boxes/feat/exec", token, map[string]any{"cmd": []string{"sh", "-c", `echo "$TOKEN"`}})
	if res := decode[server.ExecResult](t, body); code != 200 || !strings.HasPrefix(res.Stdout, "airlock-secret-") {
		t.Fatalf("the secret in the box: %d %s", code, body)
	}

	code, body = call(t, "POST", g2+"/v1/boxes/feat/snapshot", token, map[string]any{"name": "gw-snap"})
	sn := decode[server.Snapshot](t, body)
	if code != 201 || sn.Name != "gw-snap" || sn.Box != feat.ID || sn.BoxName != "feat" || sn.Node != feat.Node {
		t.Fatalf("snapshot through the gateway: %d %s", code, body)
	}
	if code, body := call(t, "POST", g1+"/v1/boxes/feat/snapshot", token, map[string]any{"name": "gw-snap"}); code != 409 || !strings.Contains(string(body), `"snapshot_exists"`) {
		t.Fatalf("a second snapshot of the same name: %d %s", code, body)
	}
	code, body = call(t, "GET", g1+"/v1/snapshots", token, nil)
	if list := decode[server.SnapshotList](t, body); code != 200 || len(list.Snapshots) != 1 || list.Snapshots[0].Node != feat.Node {
		t.Fatalf("snapshots: %d %s", code, body)
	}

	code, body = call(t, "POST", g1+"/v1/boxes/feat/fork", token, map[string]any{"n": 1})
	kids := decode[server.ForkResult](t, body).Boxes
	if code != 201 || len(kids) != 1 || kids[0].Node != feat.Node || kids[0].ID == feat.ID || len(kids[0].Ports) != 0 {
		t.Fatalf("fork through the gateway: %d %s", code, body)
	}
	if code, body := call(t, "POST", g2+"/v1/boxes/"+kids[0].ID+"/exec", token, map[string]any{"cmd": []string{"true"}}); code != 200 {
		t.Fatalf("exec in the fork's child: %d %s", code, body)
	}
	if code, body := call(t, "DELETE", g2+"/v1/boxes/"+kids[0].ID+"?force=true", token, nil); code != 204 {
		t.Fatalf("remove the child: %d %s", code, body)
	}

	code, body = call(t, "POST", g2+"/v1/boxes", token, map[string]any{"from_snapshot": "gw-snap"})
	restored := decode[server.Box](t, body)
	if code != 201 || restored.Node != feat.Node {
		t.Fatalf("restore through the gateway (snapshot on %s): %d %s", feat.Node, code, body)
	}
	if code, body := call(t, "POST", g1+"/v1/boxes/"+restored.ID+"/exec", token, map[string]any{"cmd": []string{"true"}}); code != 200 {
		t.Fatalf("exec in the restored box: %d %s", code, body)
	}

	// The gateway's event stream: the box's events, under its id.
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(sctx, "GET", g1+"/v1/events?since=0", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for !(seen["box.created"] && seen["exec.ended"]) && sc.Scan() {
		var ev server.Event
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && json.Unmarshal([]byte(d), &ev) == nil && ev.BoxID == feat.ID {
			seen[ev.Type] = true
		}
	}
	if !seen["box.created"] || !seen["exec.ended"] {
		t.Fatalf("events of box %s through the gateway: %v (%v)", feat.ID, seen, sc.Err())
	}

	for _, id := range []string{restored.ID, feat.ID} {
		if code, body := call(t, "DELETE", g1+"/v1/boxes/"+id+"?force=true", token, nil); code != 204 {
			t.Fatalf("remove %s: %d %s", id, code, body)
		}
	}
	if code, body := call(t, "DELETE", g2+"/v1/snapshots/gw-snap", token, nil); code != 204 {
		t.Fatalf("remove the snapshot: %d %s", code, body)
	}
	if code, body := call(t, "GET", g1+"/v1/snapshots/gw-snap", token, nil); code != 404 || !strings.Contains(string(body), `"snapshot_not_found"`) {
		t.Fatalf("a removed snapshot: %d %s", code, body)
	}
}

// gwTenantSnapshots: red's snapshots are its own (blue neither lists nor
// gets them, the admin sees red.NAME) and its quota of one snapshot holds
// across the nodes; a fork past red's box quota is refused before any
// snapshot is taken.
func gwTenantSnapshots(t *testing.T, g1, g2, token string) {
	if code, body := call(t, "POST", g1+"/v1/boxes/mine/snapshot", "tok-red", map[string]any{"name": "r1"}); code != 201 || !strings.Contains(string(body), `"name":"r1"`) {
		t.Fatalf("red's snapshot: %d %s", code, body)
	}
	if code, body := call(t, "POST", g2+"/v1/boxes/mine/snapshot", "tok-red", map[string]any{"name": "r2"}); code != 403 || !strings.Contains(string(body), `"quota_exceeded"`) {
		t.Fatalf("red's second snapshot: %d %s", code, body)
	}
	if code, body := call(t, "GET", g2+"/v1/snapshots", "tok-blue", nil); code != 200 || strings.Contains(string(body), "r1") {
		t.Fatalf("blue lists snapshots: %d %s", code, body)
	}
	if code, body := call(t, "GET", g2+"/v1/snapshots/r1", "tok-blue", nil); code != 404 {
		t.Fatalf("blue gets red's snapshot: %d %s", code, body)
	}
	if code, body := call(t, "GET", g1+"/v1/snapshots", token, nil); code != 200 || !strings.Contains(string(body), `"red.r1"`) {
		t.Fatalf("the admin lists snapshots: %d %s", code, body)
	}
	if code, body := call(t, "POST", g1+"/v1/boxes/mine/fork", "tok-red", map[string]any{"n": 1}); code != 403 || !strings.Contains(string(body), `"quota_exceeded"`) {
		t.Fatalf("red forks past its quota: %d %s", code, body)
	}
	if code, body := call(t, "DELETE", g1+"/v1/snapshots/r1", "tok-red", nil); code != 204 {
		t.Fatalf("red removes its snapshot: %d %s", code, body)
	}
}

// kubeTenants is a tenants file with red (one box, one snapshot at most)
// and blue (no quota), tokens tok-red and tok-blue.
func kubeTenants(t *testing.T) *tenant.Set {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tenants.json")
	if err := tenant.Add(file, tenant.Tenant{Name: "red", Quota: tenant.Quota{Boxes: 1, Snapshots: 1}}, "tok-red"); err != nil {
		t.Fatal(err)
	}
	if err := tenant.Add(file, tenant.Tenant{Name: "blue"}, "tok-blue"); err != nil {
		t.Fatal(err)
	}
	set, err := tenant.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// wsBig streams 50 MiB of random bytes (a host file: the fake driver's
// commands see the host's files) out of box id through the exec
// WebSocket of the gateway at url, and checks every byte by its SHA-256.
func wsBig(t *testing.T, url, token, id string) {
	t.Helper()
	const size = 50 << 20
	file := filepath.Join(t.TempDir(), "big")
	data := make([]byte, size)
	crand.Read(data)
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	data = nil
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http")+"/v1/boxes/"+id+"/exec/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatalf("exec WebSocket through the gateway: %v", err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(4 << 20)
	req, _ := json.Marshal(map[string]any{"cmd": []string{"cat", file}})
	if err := conn.Write(ctx, websocket.MessageText, req); err != nil {
		t.Fatal(err)
	}
	h, n := sha256.New(), 0
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("50 MiB through the exec WebSocket: %v after %d bytes", err, n)
		}
		if typ == websocket.MessageBinary {
			if len(msg) > 0 && msg[0] == 1 {
				h.Write(msg[1:])
				n += len(msg) - 1
			}
			continue
		}
		var f struct {
			Type     string `json:"type"`
			ExitCode int    `json:"exit_code"`
		}
		json.Unmarshal(msg, &f)
		if f.Type == "error" {
			t.Fatalf("50 MiB through the exec WebSocket: %s", msg)
		}
		if f.Type == "exit" {
			if f.ExitCode != 0 || n != size || !bytes.Equal(h.Sum(nil), want[:]) {
				t.Fatalf("50 MiB through the exec WebSocket: exit %d, %d bytes (want %d), same SHA-256: %v", f.ExitCode, n, size, bytes.Equal(h.Sum(nil), want[:]))
			}
			return
		}
	}
}

// sdkScript runs through the Python SDK (sync API) against AIRLOCK_URL:
// a box with labels, exec with exit code and both streams, a file written
// and read back, the box in the list with its label, and its removal.
const sdkScript = `
import os, airlock, httpx
with airlock.SyncSimpleBox(os.environ["IMAGE"], labels={"sdk": "py"}) as box:
    r = box.exec("sh", "-c", "echo hi; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "hi\n", "err\n"), r
    box.write_file("/tmp/f", b"bytes\x00\x01")
    assert box.read_file("/tmp/f") == b"bytes\x00\x01"
    bid = box.id
    got = httpx.get(os.environ["AIRLOCK_URL"] + "/v1/boxes", params={"label": "sdk=py"},
                    headers={"Authorization": "Bearer " + os.environ["AIRLOCK_TOKEN"]}).json()["boxes"]
    assert [b["id"] for b in got] == [bid], got
print("ok", bid)
`

// pythonSDK runs sdkScript with the SDK of sdk/python (its .venv, else
// $AIRLOCK_TEST_PYTHON) against the gateway at url; without a Python
// environment it says so and does nothing.
func pythonSDK(t *testing.T, url, token string) {
	t.Helper()
	py := "sdk/python/.venv/bin/python"
	if _, err := os.Stat(py); err != nil {
		if py = os.Getenv("AIRLOCK_TEST_PYTHON"); py == "" {
			t.Log("no sdk/python/.venv (hack/setup.sh makes it): the Python SDK is not run against the gateway")
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := osexec.CommandContext(ctx, py, "-c", sdkScript)
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+url, "AIRLOCK_TOKEN="+token, "IMAGE="+kubeRef, "PYTHONPATH=sdk/python/src")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ok ") {
		t.Fatalf("the Python SDK against the gateway: %v\n%s", err, out)
	}
}

// TestKubeGatewayOverhead (AIRLOCK_KUBE_BENCH=1; not a timed test: it
// asserts nothing of the times) measures the gateway's overhead against
// the node's own API, on one node (fake driver): the round trip of a
// buffered exec of true, and a create (through the gateway: a pod
// scheduled, run and reported Running by the node, then the box read
// from the node) and a remove. It logs the medians.
func TestKubeGatewayOverhead(t *testing.T) {
	if os.Getenv("AIRLOCK_KUBE_BENCH") != "1" {
		t.Skip("a benchmark: AIRLOCK_KUBE_BENCH=1 runs it")
	}
	c := kubeStart(t)
	const token, nodeToken = "user-token", "node-token"
	n := c.startAPINode(kubeRuntime(t), "airlock-bench", nodeToken)
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	gw, _ := c.startGateway(token, nodeToken, nil)
	const creates, execs = 5, 50
	for _, side := range []struct{ name, url, token string }{{"node", n.api, nodeToken}, {"gateway", gw, token}} {
		var mk, rm, ex []time.Duration
		for i := range creates {
			t0 := time.Now()
			code, body := call(t, "POST", side.url+"/v1/boxes", side.token, map[string]any{"image": kubeRef})
			mk = append(mk, time.Since(t0))
			if code != 201 {
				t.Fatalf("%s create: %d %s", side.name, code, body)
			}
			id := decode[server.Box](t, body).ID
			if i == 0 {
				for range execs {
					t0 := time.Now()
					if code, body := call(t, "POST", side.url+"/v1/boxes/"+id+"/exec", side.token, map[string]any{"cmd": []string{"true"}}); code != 200 {
						t.Fatalf("%s exec: %d %s", side.name, code, body)
					}
					ex = append(ex, time.Since(t0))
				}
			}
			t0 = time.Now()
			if code, body := call(t, "DELETE", side.url+"/v1/boxes/"+id+"?force=true", side.token, nil); code != 204 {
				t.Fatalf("%s remove: %d %s", side.name, code, body)
			}
			rm = append(rm, time.Since(t0))
		}
		t.Logf("%s: exec round trip median %v (%d), create median %v, remove median %v (%d)", side.name,
			median(ex), execs, median(mk), median(rm), creates)
	}
}

// TestKubeGatewaySDKSuite (AIRLOCK_KUBE_SDK=1; a report, not a CI test)
// runs the Python SDK's own pytest suite, unchanged but for its fixture's
// AIRLOCK_TEST_EXTERNAL=1, against a gateway over two fake-driver nodes
// (their boxes run the host's commands, python:slim included), with the
// suite's tenants alice (one box) and bob. It logs pytest's summary and
// fails when pytest does; which tests apply to a gateway is for the
// reader of the log (docs/kubernetes.md lists the routes it serves).
func TestKubeGatewaySDKSuite(t *testing.T) {
	if os.Getenv("AIRLOCK_KUBE_SDK") != "1" {
		t.Skip("a report: AIRLOCK_KUBE_SDK=1 runs it")
	}
	py := "sdk/python/.venv/bin/python"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no sdk/python/.venv")
	}
	c := kubeStart(t)
	const token, nodeToken = "test-token", "node-token"
	volumes := t.TempDir() // the suite's host volumes: granted by the nodes
	for _, name := range []string{"airlock-sdk-1", "airlock-sdk-2"} {
		ev := server.NewEvents()
		c.startAPINodeWith(kubeSnapRuntimeObs(t, ev, "python:slim"), name, nodeToken, ev, []string{volumes})
	}
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	file := filepath.Join(t.TempDir(), "tenants.json")
	tenant.Add(file, tenant.Tenant{Name: "alice", Quota: tenant.Quota{Boxes: 1}}, "tok-alice")
	tenant.Add(file, tenant.Tenant{Name: "bob"}, "tok-bob")
	set, err := tenant.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	grant, err := server.ParsePublishGrant("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url, _ := c.startGatewayWith(token, nodeToken, set, server.Policy{AllowPublish: []server.PublishGrant{grant}})
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	args := append([]string{"-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"}, strings.Fields(os.Getenv("AIRLOCK_KUBE_SDK_ARGS"))...)
	if len(args) == 6 {
		args = append(args, "sdk/python/tests")
	}
	cmd := osexec.CommandContext(ctx, py, args...)
	cmd.Env = append(os.Environ(), "AIRLOCK_TEST_EXTERNAL=1", "AIRLOCK_URL="+url, "AIRLOCK_TOKEN="+token,
		"AIRLOCK_TEST_VOLUMES="+volumes, "AIRLOCK_TEST_FAKE_DRIVER=1",
		"AIRLOCK_TEST_TENANT_ALICE=tok-alice", "AIRLOCK_TEST_TENANT_BOB=tok-bob")
	out, err := cmd.CombinedOutput()
	t.Logf("pytest against the gateway: %v\n%s", err, out)
	if err != nil {
		t.Fail()
	}
}
