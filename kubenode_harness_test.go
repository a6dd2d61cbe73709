package airlock_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/kubenode"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	sigsyaml "sigs.k8s.io/yaml"
)

// kubeBinaries returns the directory of the control plane that
// hack/build-kube.sh builds (etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager, kubectl), or why it cannot be used.
func kubeBinaries(t testing.TB) (dir, missing string) {
	mod, err := os.ReadFile("hack/kube/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("hack/kube/go.mod names no k8s.io/kubernetes version")
	}
	dir = os.Getenv("AIRLOCK_KUBE_BIN")
	if dir == "" {
		dir = filepath.Join(airlockCache(t), "kube", string(m[1]))
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return dir, "the Kubernetes control plane is not built (" + filepath.Join(dir, b) + " is missing): run hack/setup.sh (or hack/build-kube.sh)"
		}
	}
	return dir, ""
}

// airlockCache is the airlock cache, where hack/build-kube.sh builds:
// $AIRLOCK_CACHE, else the user's cache directory's airlock/.
func airlockCache(t testing.TB) string {
	if cache := os.Getenv("AIRLOCK_CACHE"); cache != "" {
		return cache
	}
	c, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(c, "airlock")
}

// kubeCluster is a loopback control plane started by kubeUp.
type kubeCluster struct {
	t          testing.TB
	client     kubernetes.Interface
	bin        string // the control plane's binaries, kubectl among them
	dir        string // hack/kube-up.sh's DIR: kubeconfig, pki/
	kubeconfig string
}

// kubeUp starts a loopback control plane (hack/kube-up.sh) for the test
// and stops it at cleanup; it returns a client and kubectl's path and
// kubeconfig.
func kubeUp(t *testing.T) (client kubernetes.Interface, kubectl func(args ...string) string) {
	c := kubeStart(t)
	return c.client, c.kubectl
}

// kubeStart is kubeUp returning the whole cluster; env (NAME=VALUE) is
// hack/kube-up.sh's (AIRLOCK_KUBE_NODE_GRACE, ...).
func kubeStart(t testing.TB, env ...string) *kubeCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a Kubernetes control plane; skipped with -short")
	}
	bin, missing := kubeBinaries(t)
	if missing != "" {
		if os.Getenv("AIRLOCK_REQUIRE_VM") == "1" {
			t.Fatal(missing)
		}
		t.Skip(missing)
	}
	dir := t.TempDir()
	up := osexec.Command("hack/kube-up.sh", dir)
	up.Env = append(append(os.Environ(), "AIRLOCK_KUBE_BIN="+bin), env...)
	t.Cleanup(func() {
		if out, err := osexec.Command("hack/kube-down.sh", dir).CombinedOutput(); err != nil {
			t.Errorf("kube-down: %v\n%s", err, out)
		}
	})
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("hack/kube-up.sh: %v\n%s", err, out)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	c, err := nodeutil.ClientsetFromEnv(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return &kubeCluster{t: t, client: c, bin: bin, dir: dir, kubeconfig: kubeconfig}
}

// kubectlCmd returns the command kubectl ARGS on the cluster.
func (c *kubeCluster) kubectlCmd(args ...string) *osexec.Cmd {
	return osexec.Command(filepath.Join(c.bin, "kubectl"), append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
}

// kubectl runs kubectl ARGS and returns its output; it fails the test
// when kubectl fails.
func (c *kubeCluster) kubectl(args ...string) string {
	c.t.Helper()
	out, err := c.kubectlCmd(args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// kubectlExit runs kubectl ARGS with stdin and returns its output and
// exit status.
func (c *kubeCluster) kubectlExit(stdin string, args ...string) (string, int) {
	c.t.Helper()
	cmd := c.kubectlCmd(args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	var ee *osexec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		c.t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return string(out), 0
}

// startNode runs an airlock node NAME on rt in the test's process, with
// the kubelet API on 127.0.0.1 (a free port) served with the cluster's
// node pair, and waits until it is Ready; it stops at cleanup.
func (c *kubeCluster) startNode(rt *airlock.Runtime, name string) {
	c.t.Helper()
	c.runNode(rt, name)
}

// runNode is startNode returning a func that stops the node (as its
// process would stop: the node's commands end, its boxes stay); cleanup
// stops it too and removes the boxes of pods left on rt.
func (c *kubeCluster) runNode(rt *airlock.Runtime, name string) (stop func()) {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	pki := filepath.Join(c.dir, "pki")
	go func() {
		done <- kubenode.Run(ctx, kubenode.Config{Name: name, Client: c.client, Runtime: rt, Logf: t.Logf,
			Ready:       func() { close(ready) },
			TLSCertFile: filepath.Join(pki, "node.crt"), TLSKeyFile: filepath.Join(pki, "node.key"),
			ClientCAFile: filepath.Join(pki, "ca.crt"), KubeletAddr: "127.0.0.1:0"})
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("kubenode.Run: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		// Boxes outlive their node (a restarted one adopts them): the
		// test's go with it.
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
		t.Fatalf("kubenode.Run: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the node was not Ready within 60 s")
	}
	return stop
}

// waitDefaultSA waits for the default service account, which the
// controller manager makes and the API server's admission wants before it
// takes a pod.
func (c *kubeCluster) waitDefaultSA() {
	c.t.Helper()
	eventually(c.t, 60*time.Second, func() string {
		if _, err := c.client.CoreV1().ServiceAccounts("default").Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
			return err.Error()
		}
		return ""
	})
}

// eventually polls f until it returns "" (done) or the timeout, then fails
// with f's last word.
func eventually(t testing.TB, timeout time.Duration, f func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := f()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKubeNodeHarness runs a real control plane on loopback (etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager built by
// hack/build-kube.sh), joins an airlock node (in process, on the fake
// driver, with the rights of deploy/kubernetes/rbac.yaml's service account
// airlock-node, as the DaemonSet runs it) and checks what a cluster user
// sees: the node is Ready with its label and taint; its kubelet API's
// serving certificate comes from the cluster's CSR API once approved
// (testServingCSR); a pod with
// runtimeClassName: airlock (the RuntimeClass of deploy/kubernetes) is
// placed on it by the scheduler, runs its command in a box and ends Failed
// with the command's exit code; a two-container pod is refused with a
// reason; deleting a pod removes its box. The DaemonSet of
// deploy/kubernetes/daemonset is accepted by the API server and puts no
// pod on the airlock node.
func TestKubeNodeHarness(t *testing.T) {
	c := kubeStart(t)
	client, kubectl := c.client, c.kubectl
	kubectl("apply", "-f", "deploy/kubernetes/")
	kubectl("apply", "-f", "deploy/kubernetes/daemonset/")
	// The node acts as the service account the DaemonSet runs it as.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:airlock-system:airlock-node",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:airlock-system", "system:authenticated"}}
	nodeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rt := kubeRuntime(t)
	ctx, cancel := context.WithCancel(context.Background())
	const name = "airlock-test-node"
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- kubenode.Run(ctx, kubenode.Config{Name: name, Client: nodeClient, Runtime: rt, Logf: t.Logf,
			Ready:       func() { close(ready) },
			ServingCert: kubenode.ServingCertCSR, KubeletAddr: "127.0.0.1:0",
			ClientCAFile: filepath.Join(c.dir, "pki", "ca.crt")})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kubenode.Run: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("kubenode.Run: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the node was not Ready within 60 s")
	}

	// The node as the API shows it.
	eventually(t, 30*time.Second, func() string {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if n.Labels[kubenode.RuntimeLabel] != "true" {
			return "labels " + strings.Join(mapKeys(n.Labels), ",")
		}
		tainted := false
		for _, tn := range n.Spec.Taints {
			if tn.Key == kubenode.RuntimeLabel && tn.Value == "true" && tn.Effect == corev1.TaintEffectNoSchedule {
				tainted = true
			}
		}
		if !tainted {
			return "no airlock taint"
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				if n.Status.Allocatable.Memory().IsZero() || n.Status.Allocatable.Pods().IsZero() {
					return "no allocatable memory or pods"
				}
				return ""
			}
		}
		return "not Ready"
	})
	// The controller manager makes the default service account, which
	// the API server's admission wants before it takes a pod.
	eventually(t, 60*time.Second, func() string {
		if _, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err.Error()
		}
		return ""
	})

	rc := "airlock"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "exit3"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: kubeRef, Command: []string{"sh", "-c", "echo hi; exit 3"}}}},
	}
	created, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	two := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "two"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{
			{Name: "a", Image: kubeRef, Command: []string{"true"}}, {Name: "b", Image: kubeRef, Command: []string{"true"}}}},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, two, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sleeper := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: kubeRef, Command: []string{"sleep", "600"}}}},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, sleeper, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	eventually(t, 60*time.Second, func() string {
		p, err := client.CoreV1().Pods("default").Get(ctx, "exit3", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Spec.NodeName != name {
			return "not scheduled onto the airlock node: nodeName " + p.Spec.NodeName
		}
		if p.Status.Phase != corev1.PodFailed || len(p.Status.ContainerStatuses) != 1 {
			return "phase " + string(p.Status.Phase)
		}
		term := p.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode != 3 || term.FinishedAt.IsZero() {
			t.Fatalf("terminated = %+v", term)
		}
		return ""
	})
	eventually(t, 60*time.Second, func() string {
		p, err := client.CoreV1().Pods("default").Get(ctx, "two", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodFailed {
			return "two-container pod: phase " + string(p.Status.Phase)
		}
		if p.Status.Reason != kubenode.ReasonUnsupported || !strings.Contains(p.Status.Message, "2 containers") {
			t.Fatalf("two-container pod: reason %q, message %q", p.Status.Reason, p.Status.Message)
		}
		return ""
	})

	t.Run("ServingCertFromCSR", func(t *testing.T) { testServingCSR(t, c, rt, name) })

	// The DaemonSet (its controller has seen the airlock node, Ready for
	// a while now) schedules nothing onto airlock's own nodes.
	eventually(t, 30*time.Second, func() string {
		ds, err := client.AppsV1().DaemonSets("airlock-system").Get(ctx, "airlock-node", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if ds.Status.ObservedGeneration < ds.Generation {
			return "the DaemonSet controller has not seen the DaemonSet"
		}
		if ds.Status.DesiredNumberScheduled != 0 {
			t.Fatalf("the DaemonSet wants %d pods with only an airlock node in the cluster", ds.Status.DesiredNumberScheduled)
		}
		return ""
	})

	boxName := kubenode.BoxName(created.UID)
	if _, err := rt.Get(ctx, boxName); err != nil {
		t.Fatalf("the pod's box %s: %v", boxName, err)
	}
	if err := client.CoreV1().Pods("default").Delete(ctx, "exit3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() string {
		if _, err := rt.Get(ctx, boxName); !errors.Is(err, airlock.ErrBoxNotFound) {
			return "box after the pod's delete: " + errString(err)
		}
		if _, err := client.CoreV1().Pods("default").Get(ctx, "exit3", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return "pod still in the API: " + errString(err)
		}
		return ""
	})
}

func mapKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func errString(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}

// TestDaemonSetManifest (no cluster) reads deploy/kubernetes/daemonset:
// its pods run `airlock node` as a service account that rbac.yaml makes
// and binds to the node's ClusterRole, on the host's network with a
// kubelet port that is not the host kubelet's (10250), and its home on
// the host, so that a restarted pod adopts its boxes.
func TestDaemonSetManifest(t *testing.T) {
	raw, err := os.ReadFile("deploy/kubernetes/daemonset/airlock-node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := sigsyaml.UnmarshalStrict(raw, &ds); err != nil {
		t.Fatalf("the DaemonSet: %v", err)
	}
	rbac, err := os.ReadFile("deploy/kubernetes/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sa, bound bool
	for _, doc := range strings.Split(string(rbac), "\n---\n") {
		var obj struct {
			Kind     string            `json:"kind"`
			Metadata metav1.ObjectMeta `json:"metadata"`
			Subjects []struct{ Kind, Name, Namespace string }
			RoleRef  struct{ Kind, Name string } `json:"roleRef"`
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
		switch obj.Kind {
		case "ServiceAccount":
			sa = sa || obj.Metadata.Name == ds.Spec.Template.Spec.ServiceAccountName && obj.Metadata.Namespace == ds.Namespace
		case "ClusterRoleBinding":
			for _, s := range obj.Subjects {
				if s.Kind == "ServiceAccount" && s.Name == ds.Spec.Template.Spec.ServiceAccountName && s.Namespace == ds.Namespace && obj.RoleRef.Name == "airlock-node" {
					bound = true
				}
			}
		}
	}
	if !sa || !bound {
		t.Errorf("service account %s/%s: made by rbac.yaml %v, bound to ClusterRole airlock-node %v", ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName, sa, bound)
	}
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	script := strings.Join(append(pod.Containers[0].Command, pod.Containers[0].Args...), " ")
	if !strings.Contains(script, "exec airlock node ") || !pod.HostNetwork {
		t.Errorf("the DaemonSet's pod runs %q, hostNetwork %v; want airlock node on the host's network", script, pod.HostNetwork)
	}
	if m := regexp.MustCompile(`--kubelet-port (\d+)`).FindStringSubmatch(script); m == nil || m[1] == "10250" {
		t.Errorf("kubelet port in %q: want one, and not the host kubelet's 10250", script)
	}
	home := ""
	for _, e := range pod.Containers[0].Env {
		if e.Name == "AIRLOCK_HOME" {
			home = e.Value
		}
	}
	onHost := false
	for _, m := range pod.Containers[0].VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && m.MountPath == home && v.HostPath != nil {
				onHost = true
			}
		}
	}
	if home == "" || !onHost {
		t.Errorf("AIRLOCK_HOME %q is not a host path", home)
	}
}

// testServingCSR: node name (kubenode.ServingCertCSR, acting as the
// DaemonSet's service account) has asked the CSR API for its kubelet API's
// serving certificate (signer kubernetes.io/kubelet-serving, CN
// system:node:NAME, O system:nodes, its InternalIP 127.0.0.1); once a
// cluster admin approves it (as kubectl certificate approve does), the
// controller manager signs it with the cluster CA, the node keeps it in its
// home and serves it, and kubectl logs and exec reach the node through an
// API server that verifies kubelets against that CA
// (--kubelet-certificate-authority in hack/kube-up.sh).
func testServingCSR(t *testing.T, c *kubeCluster, rt *airlock.Runtime, name string) {
	ctx := context.Background()
	var req *certificatesv1.CertificateSigningRequest
	eventually(t, 60*time.Second, func() string {
		l, err := c.client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		for i, r := range l.Items {
			if r.Spec.SignerName == certificatesv1.KubeletServingSignerName {
				req = &l.Items[i]
				return ""
			}
		}
		return fmt.Sprintf("no CSR for signer %s among %d", certificatesv1.KubeletServingSignerName, len(l.Items))
	})
	if want := "system:serviceaccount:airlock-system:airlock-node"; req.Spec.Username != want {
		t.Errorf("CSR %s requested by %q, want %q", req.Name, req.Spec.Username, want)
	}
	blk, _ := pem.Decode(req.Spec.Request)
	if blk == nil {
		t.Fatalf("CSR %s: no PEM request", req.Name)
	}
	x, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		t.Fatalf("CSR %s: %v", req.Name, err)
	}
	if x.Subject.CommonName != "system:node:"+name || !slices.Equal(x.Subject.Organization, []string{"system:nodes"}) ||
		len(x.IPAddresses) != 1 || !x.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) || !slices.Contains(req.Spec.Usages, certificatesv1.UsageServerAuth) {
		t.Fatalf("CSR %s: subject %v, IPs %v, usages %v", req.Name, x.Subject, x.IPAddresses, req.Spec.Usages)
	}

	// Approved as a cluster admin would (kubectl certificate approve).
	req.Status.Conditions = append(req.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: "AirlockTest", Message: "approved by TestKubeNodeHarness"})
	if _, err := c.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, req.Name, req, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The node serves the issued certificate, which the cluster CA verifies.
	caPEM, err := os.ReadFile(filepath.Join(c.dir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(n.Status.DaemonEndpoints.KubeletEndpoint.Port)))
	eventually(t, 60*time.Second, func() string {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if err != nil {
			return "TLS to the kubelet API " + addr + ": " + err.Error()
		}
		defer conn.Close()
		if cn := conn.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "system:node:"+name {
			t.Fatalf("the kubelet API serves CN %q", cn)
		}
		return ""
	})
	if _, err := os.Stat(filepath.Join(rt.Home(), "kube", "pki", "kubelet-server-current.pem")); err != nil {
		t.Errorf("the issued pair is not kept in the node's home: %v", err)
	}

	// kubectl through the API server, which verifies the node's certificate.
	eventually(t, 60*time.Second, func() string {
		out, code := c.kubectlExit("", "logs", "exit3")
		if code != 0 || out != "hi\n" {
			return fmt.Sprintf("kubectl logs exit3: exit %d, %q", code, out)
		}
		return ""
	})
	eventually(t, 60*time.Second, func() string {
		out, code := c.kubectlExit("", "exec", "sleeper", "--", "sh", "-c", "echo exec-ok")
		if code != 0 || out != "exec-ok\n" {
			return fmt.Sprintf("kubectl exec sleeper: exit %d, %q", code, out)
		}
		return ""
	})
	zero := int64(0)
	if err := c.client.CoreV1().Pods("default").Delete(ctx, "sleeper", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Error(err)
	}
}
