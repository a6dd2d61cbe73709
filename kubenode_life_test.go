package airlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/kubenode"
)

// podEvents returns "reason: message" of the events of pod NAME.
func (c *kubeCluster) podEvents(name string) []string {
	c.t.Helper()
	evs, err := c.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String()})
	if err != nil {
		c.t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out
}

// hasEvent says whether one of events starts with prefix.
func hasEvent(events []string, prefix string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

// podState returns the pod's phase and its container's status (zero when
// it has none yet).
func (c *kubeCluster) podState(name string) (corev1.PodPhase, corev1.ContainerStatus, *corev1.Pod, error) {
	p, err := c.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", corev1.ContainerStatus{}, nil, err
	}
	if len(p.Status.ContainerStatuses) != 1 {
		return p.Status.Phase, corev1.ContainerStatus{}, p, nil
	}
	return p.Status.Phase, p.Status.ContainerStatuses[0], p, nil
}

// TestKubeNodeLife (fake driver, one node in the test's process) checks
// what a cluster user sees of a pod's life on an airlock node:
//   - containerPorts are published on the node: a hostPort accepts
//     connections on the node's IP; a port another process holds shows in
//     the pod's PortsPublished condition (False, PortConflict) and a
//     Warning event, and the pod runs all the same;
//   - a changed ConfigMap reaches the files of the running pod's volume;
//   - an image that is not in its registry (a loopback one) leaves the pod
//     in ErrImagePull / ImagePullBackOff with Failed and BackOff events,
//     and the pod runs once the image is pushed;
//   - a node restarted (its process gone: commands end, boxes stay)
//     adopts its boxes: a pod under restartPolicy Always is restarted
//     (restartCount 1, lastState NodeRestarted) and its port published
//     again.
func TestKubeNodeLife(t *testing.T) {
	c := kubeStart(t)
	open, _ := lifeHome(t)
	rt := open(0)
	const node = "airlock-life"
	stop := c.runNode(rt, node)
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	ctx := context.Background()
	rc := "airlock"

	// A pod with a published port, a port held by another process, and
	// a ConfigMap volume (fake driver: its mount path is a host path).
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldPort := held.Addr().(*net.TCPAddr).Port
	free := freeTCPPort(t)
	cfgDir := filepath.Join(t.TempDir(), "cfg")
	if _, err := c.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Data: map[string]string{"app.conf": "v1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyAlways,
			Volumes: []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}}},
			Containers: []corev1.Container{{Name: "main", Image: kubeRef, Command: []string{"sleep", "600"},
				Ports:        []corev1.ContainerPort{{ContainerPort: 8000, HostPort: int32(free)}, {ContainerPort: int32(heldPort)}},
				VolumeMounts: []corev1.VolumeMount{{Name: "cfg", MountPath: cfgDir}}}}},
	}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod whose image is not in its registry yet.
	reg := imagetest.NewRegistry(t)
	lateRef := reg.Host + "/test/late:1"
	late := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "late"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: lateRef, Command: []string{"sh", "-c", "echo pulled"}}}},
	}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	published := fmt.Sprintf("127.0.0.1:%d->8000/TCP", free)
	conflict := fmt.Sprintf("127.0.0.1:%d->%d/TCP: ", heldPort, heldPort)
	eventually(t, 60*time.Second, func() string {
		phase, _, p, err := c.podState("web")
		if err != nil {
			return err.Error()
		}
		if phase != corev1.PodRunning {
			return "web: phase " + string(phase)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == kubenode.ConditionPortsPublished {
				if cond.Status != corev1.ConditionFalse || cond.Reason != kubenode.ReasonPortConflict ||
					!strings.Contains(cond.Message, conflict) || !strings.Contains(cond.Message, "published: "+published) {
					t.Fatalf("web: PortsPublished = %+v; want False, %s, naming %q and %q", cond, kubenode.ReasonPortConflict, conflict, published)
				}
				return ""
			}
		}
		return "web: no PortsPublished condition"
	})
	eventually(t, 30*time.Second, func() string {
		if evs := c.podEvents("web"); !hasEvent(evs, kubenode.ReasonPortConflict+": not published: "+conflict) {
			return fmt.Sprintf("web: no PortConflict event: %q", evs)
		}
		return ""
	})
	dialPublished := func() string {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", free), 10*time.Second)
		if err != nil {
			return "the published port: " + err.Error()
		}
		conn.Close()
		return ""
	}
	eventually(t, 30*time.Second, dialPublished)

	// The ConfigMap changes: the running box's file follows.
	if got, err := os.ReadFile(filepath.Join(cfgDir, "app.conf")); err != nil || string(got) != "v1" {
		t.Fatalf("the volume's file: %q, %v", got, err)
	}
	cm, err := c.client.CoreV1().ConfigMaps("default").Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{"app.conf": "v2", "extra": "new key"}
	if _, err := c.client.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() string {
		got, _ := os.ReadFile(filepath.Join(cfgDir, "app.conf"))
		extra, _ := os.ReadFile(filepath.Join(cfgDir, "extra"))
		if string(got) != "v2" || string(extra) != "new key" {
			return fmt.Sprintf("the volume after the ConfigMap's update: app.conf %q, extra %q", got, extra)
		}
		return ""
	})

	// The image appears in its registry after the pod backs off.
	eventually(t, 60*time.Second, func() string {
		phase, cs, _, err := c.podState("late")
		if err != nil {
			return err.Error()
		}
		if w := cs.State.Waiting; phase != corev1.PodPending || w == nil || w.Reason != "ImagePullBackOff" || w.Message != `Back-off pulling image "`+lateRef+`"` {
			return fmt.Sprintf("late: %s %+v", phase, cs.State)
		}
		return ""
	})
	eventually(t, 30*time.Second, func() string {
		evs := c.podEvents("late")
		if !hasEvent(evs, `Failed: Failed to pull image "`+lateRef+`"`) || !hasEvent(evs, `BackOff: Back-off pulling image "`+lateRef+`"`) {
			return fmt.Sprintf("late: events %q", evs)
		}
		return ""
	})
	reg.Push(t, "test/late:1", imagetest.Image(t, []string{"sh"}))
	eventually(t, 90*time.Second, func() string {
		phase, cs, _, err := c.podState("late")
		if err != nil {
			return err.Error()
		}
		if phase != corev1.PodSucceeded {
			return fmt.Sprintf("late after the push: %s %+v", phase, cs.State)
		}
		return ""
	})
	if out := c.kubectl("logs", "late"); out != "pulled\n" {
		t.Errorf("kubectl logs late: %q", out)
	}

	// The node restarts: its process ends (its commands with it), a new
	// one on the same home adopts the boxes.
	stop()
	rt.Close()
	rt2 := open(0)
	c.runNode(rt2, node)
	eventually(t, 90*time.Second, func() string {
		phase, cs, _, err := c.podState("web")
		if err != nil {
			return err.Error()
		}
		last := cs.LastTerminationState.Terminated
		if phase != corev1.PodRunning || cs.State.Running == nil || cs.RestartCount != 1 || last == nil {
			return fmt.Sprintf("web after the node's restart: %s, restartCount %d, %+v", phase, cs.RestartCount, cs.State)
		}
		if last.Reason != kubenode.ReasonNodeRestarted || last.ExitCode != 137 {
			t.Fatalf("web after the node's restart: lastState %+v, want %s, exit 137", last, kubenode.ReasonNodeRestarted)
		}
		return ""
	})
	eventually(t, 30*time.Second, dialPublished)
	if phase, _, _, err := c.podState("late"); err != nil || phase != corev1.PodSucceeded {
		t.Errorf("late after the node's restart: %s, %v (a pod that was done stays done)", phase, err)
	}
}

// TestKubeNodeEviction: two airlock nodes (fake driver, separate homes,
// in the test's process) in a cluster whose controller manager declares a
// node lost after 20 s without a lease (AIRLOCK_KUBE_NODE_GRACE). A
// ReplicaSet's pod runs on node A; A stops (its process gone, its box
// left running): A goes NotReady, Kubernetes' taint-based eviction
// deletes the pod (it tolerates the NoExecute taints for 2 s) and the
// ReplicaSet's new pod runs on node B. When A comes back, the evicted
// pod's box is removed and the pod is gone from the API: no box is left
// for a pod that no longer runs there.
func TestKubeNodeEviction(t *testing.T) {
	c := kubeStart(t, "AIRLOCK_KUBE_NODE_GRACE=20")
	openA, _ := lifeHome(t)
	openB, _ := lifeHome(t)
	rtA := openA(0)
	const nodeA, nodeB = "airlock-a", "airlock-b"
	stopA := c.runNode(rtA, nodeA)
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	ctx := context.Background()
	rc := "airlock"
	two := int64(2)
	one := int32(1)
	labels := map[string]string{"app": "keep"}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "keep"},
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
	runningOn := func(node string) (*corev1.Pod, string) {
		pods, err := c.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=keep"})
		if err != nil {
			return nil, err.Error()
		}
		var seen []string
		for i, p := range pods.Items {
			seen = append(seen, fmt.Sprintf("%s on %q %s deleting=%v", p.Name, p.Spec.NodeName, p.Status.Phase, p.DeletionTimestamp != nil))
			if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				return &pods.Items[i], ""
			}
		}
		return nil, fmt.Sprintf("no pod of the ReplicaSet runs on %s: %s", node, strings.Join(seen, "; "))
	}
	var first *corev1.Pod
	eventually(t, 60*time.Second, func() string {
		var why string
		first, why = runningOn(nodeA)
		return why
	})
	t.Logf("the ReplicaSet's pod runs on node A")
	boxA := kubenode.BoxName(first.UID)
	if _, err := rtA.Get(ctx, boxA); err != nil {
		t.Fatalf("the pod's box on node A: %v", err)
	}
	c.runNode(openB(0), nodeB)

	// Node A's process ends; its box stays.
	stopA()
	rtA.Close()
	t0 := time.Now()
	eventually(t, 90*time.Second, func() string {
		n, err := c.client.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status != corev1.ConditionTrue {
				return ""
			}
		}
		return "node A is still Ready"
	})
	t.Logf("node A NotReady %s after it stopped", time.Since(t0).Round(time.Second))
	eventually(t, 90*time.Second, func() string {
		_, why := runningOn(nodeB)
		return why
	})
	t.Logf("the ReplicaSet's pod runs on node B %s after node A stopped", time.Since(t0).Round(time.Second))

	// Node A comes back: the evicted pod's box goes, and so does the pod.
	rtA2 := openA(0)
	if _, err := rtA2.Get(ctx, boxA); err != nil {
		t.Fatalf("the evicted pod's box while node A was down: %v (want it there until A returns)", err)
	}
	c.runNode(rtA2, nodeA)
	t.Logf("node A back %s after it stopped", time.Since(t0).Round(time.Second))
	eventually(t, 60*time.Second, func() string {
		if _, err := rtA2.Get(ctx, boxA); !errors.Is(err, airlock.ErrBoxNotFound) {
			return "the evicted pod's box on node A: " + errString(err)
		}
		if _, err := c.client.CoreV1().Pods("default").Get(ctx, first.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return "the evicted pod in the API: " + errString(err)
		}
		return ""
	})
	t.Logf("the evicted pod and its box gone %s after node A stopped", time.Since(t0).Round(time.Second))
	boxes, err := rtA2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range boxes {
		if strings.HasPrefix(b.Name, kubenode.BoxNamePrefix) {
			t.Errorf("node A still has box %s (%s)", b.Name, b.State)
		}
	}
}
