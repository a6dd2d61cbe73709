package airlock_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm/fake"
	"github.com/airlock-run/airlock/internal/vmtest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
)

// BenchmarkKube measures, in the loopback harness (hack/kube-up.sh, one
// airlock node in this process, the agent-sandbox controller), the two
// figures docs/kubernetes.md and docs/performance.md give, each iteration
// one of each, reported as medians over the iterations:
//
//   - pod-running-ms: a pod (runtimeClassName: airlock, a command that
//     sleeps) created through client-go until a watch sees it Running:
//     scheduled, bound, its box created and started by the node, its
//     status pushed to the API.
//   - claim-exec-ms: `kubectl apply` of a SandboxClaim on a warm pool of
//     one until the answer of the first `kubectl exec` into the claimed
//     sandbox's pod (two kubectl processes are part of it, as for a user).
//
// Between iterations (not timed) the pod and the claim are deleted and
// the pool is ready again. fake: the fake driver; vm: real VMs of
// python:slim (skipped without them). Run it as
//
//	go test -run '^$' -bench BenchmarkKube -benchtime 5x .
func BenchmarkKube(b *testing.B) {
	b.Run("fake", func(b *testing.B) { benchKube(b, kubeBenchEnv(b, "fake")) })
	b.Run("vm", func(b *testing.B) {
		vmtest.Require(b)
		vmtest.RequireImage(b, "python:slim")
		benchKube(b, kubeBenchEnv(b, "vm"))
	})
}

// kubeBench is a cluster with an airlock node and agent-sandbox's
// controller and a warm pool of one.
type kubeBench struct {
	c     *kubeCluster
	dyn   dynamic.Interface
	image string
}

// kubeBenchEnv starts the sub-benchmark's environment (stopped at b's
// cleanup): mode fake or vm.
func kubeBenchEnv(b *testing.B, mode string) *kubeBench {
	asDir := agentSandboxDir(b)
	c := kubeStart(b)
	var rt *airlock.Runtime
	image := kubeRef
	if mode == "vm" {
		image = "python:slim"
		r, err := airlock.Open(airlock.Options{Home: b.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
		if err != nil {
			b.Fatal(err)
		}
		rt = r
	} else {
		r, err := airlock.OpenWithDriver(airlock.Options{Home: b.TempDir(), ImagesDir: fakeImageStore(b, kubeRef),
			CacheDir: b.TempDir(), Warn: func(string) {}}, fake.New(os.Getenv("AIRLOCK_AGENT")))
		if err != nil {
			b.Fatal(err)
		}
		rt = r
	}
	b.Cleanup(func() {
		boxes, _ := rt.List(context.Background())
		for _, bx := range boxes {
			rt.Remove(context.Background(), bx.ID, true)
		}
		rt.Close()
	})
	c.startNode(rt, "airlock-bench")
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	kb := &kubeBench{c: c, dyn: c.runAgentSandbox(asDir), image: image}
	if out, code := c.kubectlExit(`apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: bench, namespace: default}
spec:
  podTemplate:
    spec:
      runtimeClassName: airlock
      containers:
      - name: main
        image: `+image+`
        command: ["sleep", "3600"]
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: bench, namespace: default}
spec:
  replicas: 1
  sandboxTemplateRef: {name: bench}
`, "apply", "-f", "-"); code != 0 {
		b.Fatalf("kubectl apply: exit %d: %s", code, out)
	}
	return kb
}

func benchKube(b *testing.B, kb *kubeBench) {
	var running, claims []time.Duration
	for i := 0; b.Loop(); i++ {
		running = append(running, kb.podRunning(b, "bench-"+strconv.Itoa(i)))
		claims = append(claims, kb.claimExec(b, "bench-"+strconv.Itoa(i)))
	}
	med := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	b.ReportMetric(med(running), "pod-running-ms")
	b.ReportMetric(med(claims), "claim-exec-ms")
	b.ReportMetric(0, "ns/op")
	// On stdout, not b.Log: the node's log lines would cut it off.
	fmt.Printf("%s: pod create → Running %v; claim → first exec %v\n", b.Name(), running, claims)
}

// podRunning creates pod name and returns the time until a watch sees it
// Running; then it deletes the pod and waits until it is gone.
func (kb *kubeBench) podRunning(b *testing.B, name string) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pods := kb.c.client.CoreV1().Pods("default")
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	rc := "airlock"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: kb.image, Command: []string{"sleep", "3600"}}}}}
	t0 := time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	var d time.Duration
	for d == 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("pod %s: the watch ended before Running", name)
			}
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type != watch.Deleted && p.Status.Phase == corev1.PodRunning {
				d = time.Since(t0)
			}
		case <-ctx.Done():
			b.Fatalf("pod %s not Running within 3 min", name)
		}
	}
	b.StopTimer()
	defer b.StartTimer()
	zero := int64(0)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		b.Fatal(err)
	}
	eventually(b, 2*time.Minute, func() string {
		if _, err := pods.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return "pod " + name + " not gone: " + errString(err)
		}
		return ""
	})
	return d
}

// claimExec applies SandboxClaim name on the warm pool (once it has a
// ready sandbox) and returns the time until the first kubectl exec into
// the claimed sandbox's pod answers; then it deletes the claim.
func (kb *kubeBench) claimExec(b *testing.B, name string) time.Duration {
	ctx := context.Background()
	b.StopTimer()
	eventually(b, 3*time.Minute, func() string {
		wp, err := kb.dyn.Resource(warmPoolGVR).Namespace("default").Get(ctx, "bench", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if n, _, _ := unstructured.NestedInt64(wp.Object, "status", "readyReplicas"); n != 1 {
			return fmt.Sprintf("warm pool: %d ready", n)
		}
		return ""
	})
	b.StartTimer()
	t0 := time.Now()
	if out, code := kb.c.kubectlExit(`apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: `+name+`, namespace: default}
spec:
  warmPoolRef: {name: bench}
`, "apply", "-f", "-"); code != 0 {
		b.Fatalf("kubectl apply: exit %d: %s", code, out)
	}
	var sandbox, pod string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if time.Now().After(deadline) {
			b.Fatalf("claim %s: no answer from its sandbox (%q, pod %q) within 2 min", name, sandbox, pod)
		}
		if sandbox == "" {
			cl, err := kb.dyn.Resource(claimGVR).Namespace("default").Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				sandbox, _, _ = unstructured.NestedString(cl.Object, "status", "sandbox", "name")
			}
		}
		if sandbox != "" && pod == "" {
			if sb, err := kb.dyn.Resource(sandboxGVR).Namespace("default").Get(ctx, sandbox, metav1.GetOptions{}); err == nil {
				if pod = sb.GetAnnotations()["agents.x-k8s.io/pod-name"]; pod == "" {
					pod = sandbox // a sandbox's pod has its name unless annotated otherwise
				}
			}
		}
		if pod != "" {
			if out, code := kb.c.kubectlExit("", "exec", pod, "--", "echo", "claimed"); code == 0 && out == "claimed\n" {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	d := time.Since(t0)
	b.StopTimer()
	defer b.StartTimer()
	if err := kb.dyn.Resource(claimGVR).Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	return d
}
