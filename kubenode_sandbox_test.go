package airlock_test

import (
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/kubenode"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
)

// agentSandboxDir returns where hack/build-kube.sh puts the agent-sandbox
// controller and its CRDs (crds/), or skips the test when they are not
// built (fails under AIRLOCK_REQUIRE_VM=1).
func agentSandboxDir(t testing.TB) string {
	t.Helper()
	mod, err := os.ReadFile("hack/agent-sandbox/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`sigs\.k8s\.io/agent-sandbox (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("hack/agent-sandbox/go.mod names no sigs.k8s.io/agent-sandbox version")
	}
	dir := filepath.Join(airlockCache(t), "kube", "agent-sandbox", string(m[1]))
	if _, err := os.Stat(filepath.Join(dir, "agent-sandbox-controller")); err != nil {
		why := "the agent-sandbox controller is not built (" + dir + "): run hack/setup.sh (or hack/build-kube.sh)"
		if os.Getenv("AIRLOCK_REQUIRE_VM") == "1" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	return dir
}

var (
	sandboxGVR  = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	claimGVR    = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	warmPoolGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
)

// conditionTrue reports whether obj's status has condition typ True, and
// says what it has otherwise.
func conditionTrue(obj *unstructured.Unstructured, typ string) (bool, string) {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			return m["status"] == "True", fmt.Sprintf("%s %v: %v %v", typ, m["status"], m["reason"], m["message"])
		}
	}
	return false, "no " + typ + " condition"
}

// TestKubeAgentSandbox runs the agent-sandbox controller (SIG Apps'
// sigs.k8s.io/agent-sandbox, unmodified, built by hack/build-kube.sh) on
// the loopback control plane with its CRDs and an airlock node (fake
// driver): a Sandbox whose pod template names runtimeClassName: airlock
// becomes a pod on the airlock node, run by a box, and the Sandbox is
// Ready; a SandboxWarmPool of one keeps a ready sandbox, a SandboxClaim
// adopts it, and kubectl exec reaches the claimed sandbox's box (the
// time from the claim to that exec's answer is logged).
func TestKubeAgentSandbox(t *testing.T) {
	asDir := agentSandboxDir(t)
	c := kubeStart(t)
	rt := kubeRuntime(t)
	const node = "airlock-sandbox"
	c.startNode(rt, node)
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	dyn := c.runAgentSandbox(asDir)
	ctx := context.Background()
	apply := func(yaml string) {
		t.Helper()
		if out, code := c.kubectlExit(yaml, "apply", "-f", "-"); code != 0 {
			t.Fatalf("kubectl apply: exit %d: %s", code, out)
		}
	}
	// waitReady waits for the Sandbox's Ready condition and returns the
	// name of its pod (the warm pool's pod, for an adopted one).
	waitReady := func(name string) string {
		t.Helper()
		pod := name
		eventually(t, 90*time.Second, func() string {
			sb, err := dyn.Resource(sandboxGVR).Namespace("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "sandbox " + name + ": " + err.Error()
			}
			if ok, why := conditionTrue(sb, "Ready"); !ok {
				return "sandbox " + name + ": " + why
			}
			if p := sb.GetAnnotations()["agents.x-k8s.io/pod-name"]; p != "" {
				pod = p
			}
			return ""
		})
		return pod
	}
	// onNode checks that the pod runs on the airlock node, in its box.
	onNode := func(podName string) {
		t.Helper()
		p, err := c.client.CoreV1().Pods("default").Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != node || p.Status.PodIP == "" {
			t.Fatalf("pod %s: node %q, podIP %q", podName, p.Spec.NodeName, p.Status.PodIP)
		}
		if _, err := rt.Get(ctx, kubenode.BoxName(p.UID)); err != nil {
			t.Fatalf("pod %s's box: %v", podName, err)
		}
	}
	const podSpec = `
      runtimeClassName: airlock
      containers:
      - name: main
        image: ` + kubeRef + `
        command: ["sh", "-c", "echo ready; exec sleep 3600"]`

	apply(`apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata:
  name: hello
  namespace: default
spec:
  podTemplate:
    spec:` + podSpec + "\n")
	onNode(waitReady("hello"))
	if out := c.kubectl("exec", "hello", "--", "echo", "in the box"); out != "in the box\n" {
		t.Errorf("kubectl exec into the sandbox: %q", out)
	}

	// A warm pool of one from a template; a claim adopts its sandbox.
	apply(`apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: airlock-template
  namespace: default
spec:
  podTemplate:
    spec:` + podSpec + `
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata:
  name: pool
  namespace: default
spec:
  replicas: 1
  sandboxTemplateRef:
    name: airlock-template
`)
	eventually(t, 90*time.Second, func() string {
		wp, err := dyn.Resource(warmPoolGVR).Namespace("default").Get(ctx, "pool", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if n, _, _ := unstructured.NestedInt64(wp.Object, "status", "readyReplicas"); n != 1 {
			return fmt.Sprintf("warm pool: %d ready", n)
		}
		return ""
	})
	t0 := time.Now()
	apply(`apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata:
  name: mine
  namespace: default
spec:
  warmPoolRef:
    name: pool
`)
	var claimed string
	eventually(t, 90*time.Second, func() string {
		cl, err := dyn.Resource(claimGVR).Namespace("default").Get(ctx, "mine", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		claimed, _, _ = unstructured.NestedString(cl.Object, "status", "sandbox", "name")
		if claimed == "" {
			_, why := conditionTrue(cl, "Ready")
			return "claim has no sandbox yet: " + why
		}
		return ""
	})
	if !strings.HasPrefix(claimed, "pool-") {
		t.Errorf("the claim got sandbox %q, not the warm pool's", claimed)
	}
	pod := waitReady(claimed)
	var out string
	eventually(t, 60*time.Second, func() string {
		var code int
		if out, code = c.kubectlExit("", "exec", pod, "--", "echo", "claimed"); code != 0 || out != "claimed\n" {
			return fmt.Sprintf("kubectl exec into the claimed sandbox: exit %d: %s", code, out)
		}
		return ""
	})
	t.Logf("claim -> first exec: %s", time.Since(t0).Round(time.Millisecond))
	onNode(pod)
}

// runAgentSandbox installs agent-sandbox's CRDs (from asDir, built by
// hack/build-kube.sh) and runs its controller, as its manifests run it
// (with the extensions), on the cluster's kubeconfig, with no metrics or
// probe listeners, until cleanup (its log's tail is logged when the test
// failed). It returns a dynamic client of the cluster.
func (c *kubeCluster) runAgentSandbox(asDir string) dynamic.Interface {
	t := c.t
	t.Helper()
	c.kubectl("apply", "-f", filepath.Join(asDir, "crds"))
	c.kubectl("wait", "--for", "condition=established", "--timeout=60s",
		"crd/sandboxes.agents.x-k8s.io", "crd/sandboxtemplates.extensions.agents.x-k8s.io",
		"crd/sandboxwarmpools.extensions.agents.x-k8s.io", "crd/sandboxclaims.extensions.agents.x-k8s.io")

	ctrlLog := filepath.Join(t.TempDir(), "controller.log")
	lf, err := os.Create(ctrlLog)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	ctrl := osexec.Command(filepath.Join(asDir, "agent-sandbox-controller"), "--extensions", "--leader-elect=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
	ctrl.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	ctrl.Stdout, ctrl.Stderr = lf, lf
	if err := ctrl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctrl.Process.Kill()
		ctrl.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(ctrlLog)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("agent-sandbox-controller log (tail):\n%s", b)
		}
	})

	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}
