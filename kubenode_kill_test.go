package airlock_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
	"github.com/airlock-run/airlock/kubenode"
)

// asCLIEnv, set to 1, makes this test binary the airlock CLI (TestMain
// runs cli.Main on its arguments), so that a test runs `airlock node`
// processes without building the CLI. Built with the airlock_testfaults
// tag, the CLI then runs its boxes on the fake driver with
// AIRLOCK_TEST_DRIVER=fake.
const asCLIEnv = "AIRLOCK_TEST_AS_CLI"

// nodeProcess is an `airlock node` process of the test.
type nodeProcess struct {
	cmd  *osexec.Cmd
	done chan struct{}
	log  string // its stderr's file
}

// homeProcesses returns the processes (pid: command line) of an airlock
// home other than the test's: those with it in their environment
// (AIRLOCK_HOME: airlock itself and the fake driver's agents, which
// inherit it) or on their command line, and its boxes' VMs
// (vmtest.HomeProcesses).
func homeProcesses(home string) map[int]string {
	out := vmtest.HomeProcesses(home)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), []byte("\x00AIRLOCK_HOME="+home+"\x00")) {
			continue
		}
		if c, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil {
			out[pid] = strings.ReplaceAll(string(c), "\x00", " ")
		}
	}
	return out
}

// runNodeProcess starts `airlock node NAME` (this binary as the CLI, fake driver)
// on home, joined to the cluster with its kubelet API on 127.0.0.1 (a
// free port); stop ends it with SIGTERM (cleanup does too, and kills what
// is left of the home's boxes).
func (c *kubeCluster) runNodeProcess(home, images, name string) *nodeProcess {
	t := c.t
	t.Helper()
	pki := filepath.Join(c.dir, "pki")
	logf, err := os.CreateTemp(c.dir, "node-"+name+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := osexec.Command(self, "node", "--kubeconfig", c.kubeconfig, "--name", name,
		"--address", "127.0.0.1", "--kubelet-port", "0", "--api-listen", "off",
		"--tls-cert-file", filepath.Join(pki, "node.crt"), "--tls-private-key-file", filepath.Join(pki, "node.key"),
		"--client-ca-file", filepath.Join(pki, "ca.crt"))
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+images, "AIRLOCK_TEST_DRIVER=fake", asCLIEnv+"=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	np := &nodeProcess{cmd: cmd, done: make(chan struct{}), log: logf.Name()}
	go func() { cmd.Wait(); close(np.done) }()
	t.Cleanup(func() {
		np.stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(np.log)
			t.Logf("airlock node %s (pid %d):\n%s", name, cmd.Process.Pid, b)
		}
	})
	return np
}

// stop ends the node with SIGTERM, and SIGKILL after 30 s.
func (np *nodeProcess) stop(t testing.TB) {
	np.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-np.done:
	case <-time.After(30 * time.Second):
		t.Errorf("airlock node pid %d did not stop within 30 s of SIGTERM", np.cmd.Process.Pid)
		np.cmd.Process.Kill()
		<-np.done
	}
}

// kill ends the node with SIGKILL: nothing of it runs its shutdown.
func (np *nodeProcess) kill() {
	np.cmd.Process.Kill()
	<-np.done
}

// nodeReady says why node NAME is not Ready ("" when it is).
func (c *kubeCluster) nodeReady(name string) string {
	n, err := c.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			if cond.Status == corev1.ConditionTrue {
				return ""
			}
			return fmt.Sprintf("node %s: Ready %s (%s)", name, cond.Status, cond.Reason)
		}
	}
	return "node " + name + ": no Ready condition"
}

// podReady returns the pod's Ready condition.
func podReady(p *corev1.Pod) corev1.ConditionStatus {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status
		}
	}
	return ""
}

// TestKubeNodeKilled runs two `airlock node` processes (the CLI binary,
// boxes on the fake driver, separate homes) in a control plane that
// declares a node lost after 20 s without a lease, and kills one with
// SIGKILL:
//   - the killed node goes NotReady and its pods not Ready, as Kubernetes'
//     node lifecycle controller marks them; a ReplicaSet's pod there is
//     evicted (it tolerates the NoExecute taints for 2 s) and its new pod
//     runs on the other node;
//   - the other node serves on: its pod runs, kubectl exec reaches it; and
//     its pods end as the pod spec says: activeDeadlineSeconds fails one
//     with DeadlineExceeded, imagePullPolicy Never with a missing image
//     waits in ErrImageNeverPull;
//   - restarted (same home and name), the killed node adopts the box of
//     the pod still bound to it (the same box, its container restarted:
//     NodeRestarted) and removes the evicted pod's box: no process or box
//     directory of it is left.
func TestKubeNodeKilled(t *testing.T) {
	airlock.RequireTestFaults(t) // the CLI's fake driver
	c := kubeStart(t, "AIRLOCK_KUBE_NODE_GRACE=20")
	images := fakeImageStore(t, kubeRef)
	homeA, homeB := t.TempDir(), t.TempDir()
	t.Cleanup(func() { // after the nodes' own cleanups: their boxes go too
		for _, home := range []string{homeA, homeB} {
			for pid := range homeProcesses(home) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	const nodeA, nodeB = "airlock-ka", "airlock-kb"
	a := c.runNodeProcess(homeA, images, nodeA)
	eventually(t, 60*time.Second, func() string { return c.nodeReady(nodeA) })
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	ctx := context.Background()
	pods := c.client.CoreV1().Pods("default")
	rc := "airlock"
	two := int64(2)
	one := int32(1)
	forever := []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	sleeper := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{RuntimeClassName: &rc, NodeName: node, Tolerations: forever,
				Containers: []corev1.Container{{Name: "main", Image: kubeRef, Command: []string{"sh", "-c", "echo up; sleep 600"}}}}}
	}
	// On node A: a pod that stays bound to it, and a ReplicaSet's pod
	// (node B is not there yet).
	if _, err := pods.Create(ctx, sleeper("stay", nodeA), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "moves"}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "moves"},
		Spec: appsv1.ReplicaSetSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{RuntimeClassName: &rc,
					Tolerations: []corev1.Toleration{
						{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &two},
						{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &two}},
					Containers: []corev1.Container{{Name: "main", Image: kubeRef, Command: []string{"sleep", "600"}}}}}},
	}
	if _, err := c.client.AppsV1().ReplicaSets("default").Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rsPodOn := func(node string) (*corev1.Pod, string) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=moves"})
		if err != nil {
			return nil, err.Error()
		}
		var seen []string
		for i, p := range l.Items {
			seen = append(seen, fmt.Sprintf("%s on %q %s deleting=%v", p.Name, p.Spec.NodeName, p.Status.Phase, p.DeletionTimestamp != nil))
			if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				return &l.Items[i], ""
			}
		}
		return nil, fmt.Sprintf("no pod of the ReplicaSet runs on %s: %s", node, strings.Join(seen, "; "))
	}
	running := func(name string) (*corev1.Pod, string) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err.Error()
		}
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil {
			return nil, fmt.Sprintf("%s: %s %+v", name, p.Status.Phase, p.Status.ContainerStatuses)
		}
		return p, ""
	}
	var moved, stay *corev1.Pod
	eventually(t, 60*time.Second, func() string {
		var why string
		if moved, why = rsPodOn(nodeA); why != "" {
			return why
		}
		stay, why = running("stay")
		return why
	})
	stayBox := strings.TrimPrefix(stay.Status.ContainerStatuses[0].ContainerID, "airlock://")
	movedBox := strings.TrimPrefix(moved.Status.ContainerStatuses[0].ContainerID, "airlock://")
	if stayBox == "" || movedBox == "" {
		t.Fatalf("container IDs: stay %q, the ReplicaSet's pod %q", stayBox, movedBox)
	}

	// Node B, and its own pods.
	c.runNodeProcess(homeB, images, nodeB)
	eventually(t, 60*time.Second, func() string { return c.nodeReady(nodeB) })
	if _, err := pods.Create(ctx, sleeper("onb", nodeB), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() string { _, why := running("onb"); return why })

	// Node A is killed: no shutdown, its boxes left running.
	a.kill()
	t0 := time.Now()
	if _, err := os.Stat(filepath.Join(homeA, "boxes", stayBox)); err != nil {
		t.Fatalf("stay's box after its node was killed: %v", err)
	}
	eventually(t, 90*time.Second, func() string {
		if why := c.nodeReady(nodeA); why == "" {
			return "node A is still Ready"
		}
		p, err := pods.Get(ctx, "stay", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if r := podReady(p); r != corev1.ConditionFalse {
			return "stay on the lost node: Ready " + string(r)
		}
		return ""
	})
	t.Logf("node A NotReady and its pod not Ready %s after the kill", time.Since(t0).Round(time.Second))

	// Node B serves on: the ReplicaSet's new pod, exec into its pod, and
	// pods whose spec ends or holds them.
	eventually(t, 90*time.Second, func() string { _, why := rsPodOn(nodeB); return why })
	t.Logf("the ReplicaSet's pod runs on node B %s after the kill", time.Since(t0).Round(time.Second))
	if out, code := c.kubectlExit("", "exec", "onb", "--", "echo", "alive"); code != 0 || out != "alive\n" {
		t.Errorf("kubectl exec into node B's pod: exit %d, %q", code, out)
	}
	deadline := sleeper("deadline", nodeB)
	secs := int64(3)
	deadline.Spec.ActiveDeadlineSeconds = &secs
	if _, err := pods.Create(ctx, deadline, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	never := sleeper("never", nodeB)
	never.Spec.Containers[0].Image = "test/absent:v1"
	never.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	if _, err := pods.Create(ctx, never, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() string {
		p, err := pods.Get(ctx, "deadline", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodFailed || p.Status.Reason != kubenode.ReasonDeadlineExceeded {
			return fmt.Sprintf("deadline: %s %q", p.Status.Phase, p.Status.Reason)
		}
		return ""
	})
	eventually(t, 60*time.Second, func() string {
		p, err := pods.Get(ctx, "never", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil ||
			p.Status.ContainerStatuses[0].State.Waiting.Reason != kubenode.ReasonErrImageNeverPull {
			return fmt.Sprintf("never: %s %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		return ""
	})
	if out := c.kubectl("logs", "deadline"); out != "up\n" {
		t.Errorf("kubectl logs of the pod past its deadline: %q", out)
	}

	// Node A comes back: it adopts stay's box and removes the evicted
	// pod's.
	c.runNodeProcess(homeA, images, nodeA)
	eventually(t, 60*time.Second, func() string { return c.nodeReady(nodeA) })
	t.Logf("node A Ready again %s after the kill", time.Since(t0).Round(time.Second))
	eventually(t, 60*time.Second, func() string {
		if _, err := pods.Get(ctx, moved.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return "the evicted pod in the API: " + errString(err)
		}
		if _, err := os.Stat(filepath.Join(homeA, "boxes", movedBox)); !os.IsNotExist(err) {
			return "the evicted pod's box directory: " + errString(err)
		}
		p, why := running("stay")
		if why != "" {
			return why
		}
		cs := p.Status.ContainerStatuses[0]
		if cs.RestartCount != 1 || cs.LastTerminationState.Terminated == nil || podReady(p) != corev1.ConditionTrue {
			return fmt.Sprintf("stay after node A's restart: restartCount %d, lastState %+v, Ready %s", cs.RestartCount, cs.LastTerminationState, podReady(p))
		}
		if last := cs.LastTerminationState.Terminated; last.Reason != kubenode.ReasonNodeRestarted {
			t.Fatalf("stay after node A's restart: lastState %+v, want %s", last, kubenode.ReasonNodeRestarted)
		}
		if cs.ContainerID != "airlock://"+stayBox {
			t.Fatalf("stay after node A's restart: container %s, want its box adopted (airlock://%s)", cs.ContainerID, stayBox)
		}
		return ""
	})
	// Nothing of the evicted pod's box runs; every process of home A but
	// the node is stay's box's.
	eventually(t, 30*time.Second, func() string {
		var other []string
		for pid, cmdline := range homeProcesses(homeA) {
			if strings.Contains(cmdline, movedBox) || (!strings.Contains(cmdline, stayBox) && !strings.Contains(cmdline, " node ")) {
				other = append(other, fmt.Sprintf("%d: %s", pid, cmdline))
			}
		}
		sort.Strings(other)
		if len(other) > 0 {
			return "processes of home A that are not stay's box's or the node's: " + strings.Join(other, "; ")
		}
		return ""
	})
	ents, err := os.ReadDir(filepath.Join(homeA, "boxes"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() && e.Name() != stayBox {
			t.Errorf("home A keeps box directory %s (stay's is %s)", e.Name(), stayBox)
		}
	}
	if p, why := running("onb"); why != "" || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("node B's pod after node A's return: %s", why)
	}
}
