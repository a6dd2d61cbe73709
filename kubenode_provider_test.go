package airlock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/kubenode"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	kfake "k8s.io/client-go/kubernetes/fake"

	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// kubeRuntime opens a Runtime on the fake driver (its commands run on the
// host with a real agent) with kubeRef in its image store.
func kubeRuntime(t *testing.T) *airlock.Runtime {
	t.Helper()
	open, ref := lifeHome(t)
	if ref != kubeRef {
		t.Fatalf("lifeHome's image is %s", ref)
	}
	return open(0)
}

// kubeSnapRuntime is kubeRuntime on the fake driver that can snapshot,
// and so suspend a box (BoxOptions.IdleAction suspend).
func kubeSnapRuntime(t *testing.T, more ...string) *airlock.Runtime {
	t.Helper()
	return kubeSnapRuntimeObs(t, nil, more...)
}

// kubeSnapRuntimeObs is kubeSnapRuntime whose Runtime reports to obs
// (nil: none).
func kubeSnapRuntimeObs(t *testing.T, obs airlock.Observer, more ...string) *airlock.Runtime {
	t.Helper()
	drv := fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT"))
	home, images, cache := t.TempDir(), fakeImageStore(t, kubeRef), t.TempDir()
	if len(more) > 0 {
		s, err := image.Open(images)
		if err != nil {
			t.Fatal(err)
		}
		for _, ref := range more { // more names of the same image
			if _, err := s.WriteImage(context.Background(), ref, imagetest.Image(t, []string{"sh"}), "test image", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	r, err := airlock.OpenWithDriver(airlock.Options{Home: home, ImagesDir: images, CacheDir: cache, Warn: func(w string) { t.Log(w) }, Observer: obs}, drv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // boxes first: their agents are host processes
		boxes, _ := r.List(context.Background())
		for _, b := range boxes {
			r.Remove(context.Background(), b.ID, true)
		}
		r.Close()
	})
	return r
}

// kubeRef is the image of the fake driver's boxes (cmd sh).
const kubeRef = "test/fake:v1"

func newPod(name, uid string, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(uid), CreationTimestamp: metav1.Now()},
		Spec:       corev1.PodSpec{NodeName: "n1", RestartPolicy: corev1.RestartPolicyNever, Containers: containers},
	}
}

func shell(script string) corev1.Container {
	return corev1.Container{Name: "main", Image: kubeRef, Command: []string{"sh", "-c", script}}
}

// waitStatus polls the provider until ok(status) or the deadline.
func waitStatus(t *testing.T, p *kubenode.Provider, name string, ok func(*corev1.PodStatus) bool) *corev1.PodStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := p.GetPodStatus(context.Background(), "default", name)
		if err == nil && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: status %+v, err %v", name, st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPodRunsAsBox: a pod's command runs as its box's main command; the
// pod goes Running, then Failed with the exit code, times and the output
// in its log; deleting it removes the box.
func TestPodRunsAsBox(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	c := shell(`echo "hi $GREETING from $PWD"; exit 3`)
	c.Env = []corev1.EnvVar{{Name: "GREETING", Value: "there"}}
	c.WorkingDir = "/tmp"
	pod := newPod("p1", "uid-1", c)
	if err := p.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, p, "p1", func(s *corev1.PodStatus) bool { return s.Phase == corev1.PodFailed })
	term := st.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 3 || term.Reason != "Error" || term.StartedAt.IsZero() || term.FinishedAt.Before(&term.StartedAt) {
		t.Fatalf("terminated state = %+v", term)
	}
	box, err := rt.Get(context.Background(), kubenode.BoxName("uid-1"))
	if err != nil {
		t.Fatalf("the pod's box: %v", err)
	}
	// The box stops after its command (restartPolicy Never); its record
	// keeps the main command's end.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, _ := box.Info(context.Background())
		if info.State == airlock.BoxStopped {
			if info.Exit == nil || info.Exit.Reason != airlock.ExitExited || info.Exit.ExitCode != 3 {
				t.Errorf("box exit record = %+v (the command is the box's main command)", info.Exit)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("box still %s after its command ended", info.State)
		}
	}
	rc, err := p.GetContainerLogs(context.Background(), "default", "p1", "main", api.ContainerLogOpts{})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(rc)
	rc.Close()
	if string(out) != "hi there from /tmp\n" {
		t.Errorf("log = %q", out)
	}
	if err := p.DeletePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Get(context.Background(), kubenode.BoxName("uid-1")); !errors.Is(err, airlock.ErrBoxNotFound) {
		t.Errorf("box after delete: %v", err)
	}
	if _, err := p.GetPod(context.Background(), "default", "p1"); err == nil {
		t.Error("the deleted pod is still listed")
	}
}

// TestPodSucceeds: exit 0 is phase Succeeded, reason Completed; while the
// command runs the pod is Running with the container started and ready.
func TestPodSucceeds(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() // the fake driver's commands run on the host
	gate := filepath.Join(dir, "go")
	if err := p.CreatePod(context.Background(), newPod("p2", "uid-2", shell("while [ ! -e "+gate+" ]; do sleep 0.05; done"))); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, p, "p2", func(s *corev1.PodStatus) bool { return s.Phase == corev1.PodRunning })
	if cs := st.ContainerStatuses[0]; cs.State.Running == nil || !cs.Ready {
		t.Errorf("running pod's container: %+v", cs)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	st = waitStatus(t, p, "p2", func(s *corev1.PodStatus) bool { return s.Phase == corev1.PodSucceeded })
	if term := st.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 0 || term.Reason != "Completed" {
		t.Errorf("terminated = %+v", term)
	}
}

// TestTwoContainersRefused: a pod with two containers fails at once with
// reason UnsupportedPodSpec and a message that says why; no box is made.
func TestTwoContainersRefused(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	two := newPod("p3", "uid-3", shell("true"), shell("true"))
	two.Spec.Containers[1].Name = "side"
	if err := p.CreatePod(context.Background(), two); err != nil {
		t.Fatal(err)
	}
	st, err := p.GetPodStatus(context.Background(), "default", "p3")
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != corev1.PodFailed || st.Reason != kubenode.ReasonUnsupported || !strings.Contains(st.Message, "2 containers") {
		t.Errorf("status = %s %s %q", st.Phase, st.Reason, st.Message)
	}
	if boxes, _ := rt.List(context.Background()); len(boxes) != 0 {
		t.Errorf("boxes = %d, want none", len(boxes))
	}
}

// TestAdoptByPodUID: a restarted node keeps the box of a pod still bound
// to it (listed by pod UID through the API: client-go's fake clientset)
// and removes the box of a pod that is gone.
func TestAdoptByPodUID(t *testing.T) {
	rt := kubeRuntime(t)
	ctx := context.Background()
	for _, uid := range []string{"kept", "gone"} {
		if _, err := rt.Create(ctx, airlock.BoxOptions{Image: kubeRef, Name: kubenode.BoxName(types.UID(uid))}); err != nil {
			t.Fatal(err)
		}
	}
	other, err := rt.Create(ctx, airlock.BoxOptions{Image: kubeRef, Name: "not-a-pod"})
	if err != nil {
		t.Fatal(err)
	}
	kept := newPod("kept-pod", "kept", shell("sleep 100"))
	kept.Spec.RestartPolicy = corev1.RestartPolicyAlways
	kept.Status.Phase = corev1.PodRunning
	kept.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", RestartCount: 2}}
	client := kfake.NewClientset(kept)
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", "n1").String()})
	if err != nil {
		t.Fatal(err)
	}
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Adopt(ctx, pods.Items); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Get(ctx, kubenode.BoxName("gone")); !errors.Is(err, airlock.ErrBoxNotFound) {
		t.Errorf("the box of a gone pod: %v", err)
	}
	if _, err := rt.Get(ctx, other.ID()); err != nil {
		t.Errorf("a box that runs no pod was touched: %v", err)
	}
	got, err := p.GetPods(ctx)
	if err != nil || len(got) != 1 || got[0].Name != "kept-pod" || got[0].Status.Phase != corev1.PodRunning {
		t.Fatalf("GetPods = %v, %v", got, err)
	}
	// Its command did not outlive the node that ran it: the container
	// is restarted (restartPolicy Always) and the API's count goes on.
	st := waitStatus(t, p, "kept-pod", func(s *corev1.PodStatus) bool {
		cs := s.ContainerStatuses[0]
		return cs.State.Running != nil && cs.RestartCount == 3
	})
	if last := st.ContainerStatuses[0].LastTerminationState.Terminated; last == nil || last.Reason != kubenode.ReasonNodeRestarted || last.ExitCode != 137 {
		t.Errorf("lastState = %+v, want %s, exit 137", last, kubenode.ReasonNodeRestarted)
	}
	if err := p.DeletePod(ctx, kept); err != nil {
		t.Fatal(err)
	}
}

// TestPodStatusPushed: statuses reach virtual-kubelet's callback as they
// change (Running, then the end), not at its next poll; a running pod
// that is deleted is reported terminated.
func TestPodStatusPushed(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *corev1.Pod, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.NotifyPods(ctx, func(pod *corev1.Pod) { got <- pod })
	wait := func(name string, ok func(*corev1.Pod) bool) *corev1.Pod {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case pod := <-got:
				if pod.Name == name && ok(pod) {
					return pod
				}
			case <-timeout:
				t.Fatalf("pod %s: no such status pushed", name)
			}
		}
	}
	t0 := time.Now()
	if err := p.CreatePod(ctx, newPod("quick", "uid-q", shell("exit 4"))); err != nil {
		t.Fatal(err)
	}
	end := wait("quick", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
	if term := end.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 4 {
		t.Errorf("pushed end = %+v", end.Status.ContainerStatuses[0].State)
	}
	if d := time.Since(t0); d > 4*time.Second {
		t.Errorf("the end was pushed after %s: polled, not pushed", d)
	}
	long := newPod("long", "uid-l", shell("sleep 60"))
	if err := p.CreatePod(ctx, long); err != nil {
		t.Fatal(err)
	}
	running := wait("long", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodRunning })
	if err := p.DeletePod(ctx, running); err != nil {
		t.Fatal(err)
	}
	gone := wait("long", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodSucceeded })
	if term := gone.Status.ContainerStatuses[0].State.Terminated; term == nil || term.Reason != "Terminated" || term.StartedAt.IsZero() {
		t.Errorf("deleted pod pushed as %+v", gone.Status.ContainerStatuses[0].State)
	}
}

// TestPodRestarts: under restartPolicy Always a container that ends runs
// again in its box (a new boot: the count file on the host shows each
// run): the first restart at once, then the pod waits in CrashLoopBackOff
// with restartCount 1 and the last run as lastState; --previous reads the
// run before. Deleting the pod during the back-off removes its box.
func TestPodRestarts(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(t.TempDir(), "count")
	pod := newPod("again", "uid-again", shell(`n=$(cat `+count+` 2>/dev/null || echo 0); n=$((n+1)); echo $n >`+count+`; echo "run $n"`))
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	if err := p.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, p, "again", func(s *corev1.PodStatus) bool {
		w := s.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "CrashLoopBackOff"
	})
	cs := st.ContainerStatuses[0]
	// The first back-off (after the second run) lasts 10 s; a test
	// stalled past it sees a later one.
	if st.Phase != corev1.PodRunning || cs.RestartCount < 1 || cs.Ready {
		t.Errorf("in back-off: phase %s, restartCount %d, ready %v", st.Phase, cs.RestartCount, cs.Ready)
	}
	if last := cs.LastTerminationState.Terminated; last == nil || last.ExitCode != 0 || last.Reason != "Completed" {
		t.Errorf("lastState = %+v", cs.LastTerminationState)
	}
	if want := fmt.Sprintf("back-off %s restarting failed container=main pod=again_default(uid-again)", 10*time.Second<<(cs.RestartCount-1)); cs.State.Waiting.Message != want {
		t.Errorf("waiting message %q", cs.State.Waiting.Message)
	}
	logs := func(previous bool) string {
		rc, err := p.GetContainerLogs(context.Background(), "default", "again", "main", api.ContainerLogOpts{Previous: previous})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		return string(b)
	}
	// The logs of the last run and the one before, read while the
	// container is backing off (tried again if it restarted meanwhile:
	// the back-off doubles).
	backingOff := func() int32 {
		st, err := p.GetPodStatus(context.Background(), "default", "again")
		if err != nil {
			t.Fatal(err)
		}
		if w := st.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "CrashLoopBackOff" {
			return -1
		}
		return st.ContainerStatuses[0].RestartCount
	}
	eventually(t, 60*time.Second, func() string {
		n := backingOff()
		cur, prev := logs(false), logs(true)
		if n < 1 || backingOff() != n {
			return "the container restarted while its logs were read"
		}
		if cur != fmt.Sprintf("run %d\n", n+1) || prev != fmt.Sprintf("run %d\n", n) {
			t.Fatalf("restartCount %d: logs %q, --previous %q", n, cur, prev)
		}
		return ""
	})
	if err := p.DeletePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Get(context.Background(), kubenode.BoxName("uid-again")); !errors.Is(err, airlock.ErrBoxNotFound) {
		t.Errorf("box after delete: %v", err)
	}
}

// TestPodOnFailure: under restartPolicy OnFailure a container that exits
// 0 is done (Succeeded, no restart).
func TestPodOnFailure(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	pod := newPod("fine", "uid-fine", shell("echo ok"))
	pod.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	if err := p.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, p, "fine", func(s *corev1.PodStatus) bool { return s.Phase == corev1.PodSucceeded })
	if cs := st.ContainerStatuses[0]; cs.RestartCount != 0 || cs.State.Terminated == nil {
		t.Errorf("container %+v", cs)
	}
	if _, err := p.GetContainerLogs(context.Background(), "default", "fine", "main", api.ContainerLogOpts{Previous: true}); err == nil {
		t.Error("--previous of a container that never restarted was served")
	}
}

// TestPodVolumes: a pod's configMap and secret volumes are files in its
// box at their mount paths (with the secret's defaultMode), its emptyDir
// a directory open to every user; the pod's IP is its node's (a box has
// no address of its own). While the ConfigMap is missing the pod waits in
// ContainerCreating with the kubelet's message. Fake driver: mount paths
// are host paths.
func TestPodVolumes(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	client := kfake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: "default"},
		Data: map[string][]byte{"token": []byte("s3cret")}})
	p.SetAPI(client, "192.0.2.7")
	dir := t.TempDir()
	mode := int32(0o640)
	c := shell(`cat ` + dir + `/cfg/app.conf ` + dir + `/sec/token; echo; stat -c '%a %F' ` + dir + `/sec/token ` + dir + `/scratch`)
	c.VolumeMounts = []corev1.VolumeMount{{Name: "cfg", MountPath: dir + "/cfg"}, {Name: "sec", MountPath: dir + "/sec"}, {Name: "scratch", MountPath: dir + "/scratch"}}
	pod := newPod("vols", "uid-vols", c)
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}},
		{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sec", DefaultMode: &mode}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	if err := p.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, p, "vols", func(s *corev1.PodStatus) bool {
		w := s.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "ContainerCreating" && w.Message == `MountVolume.SetUp failed for volume "cfg" : configmap "app" not found`
	})
	if _, err := client.CoreV1().ConfigMaps("default").Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default"},
		Data: map[string]string{"app.conf": "mode=fast\n"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, p, "vols", func(s *corev1.PodStatus) bool { return s.Phase == corev1.PodSucceeded || s.Phase == corev1.PodFailed })
	rc, err := p.GetContainerLogs(context.Background(), "default", "vols", "main", api.ContainerLogOpts{})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(rc)
	rc.Close()
	if st.Phase != corev1.PodSucceeded || string(out) != "mode=fast\ns3cret\n640 regular file\n777 directory\n" {
		t.Errorf("phase %s, output %q", st.Phase, out)
	}
	if st.PodIP != "192.0.2.7" || len(st.PodIPs) != 1 || st.HostIP != "192.0.2.7" {
		t.Errorf("podIP %q, podIPs %v, hostIP %q: want the node's IP", st.PodIP, st.PodIPs, st.HostIP)
	}
}

// TestPodImagePullBackOff: a pod whose image cannot be pulled waits in
// ErrImagePull, then ImagePullBackOff (the kubelet's message), and runs
// once the image is in its registry (a loopback registry), pulled again
// after the back-off.
func TestPodImagePullBackOff(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	reg := imagetest.NewRegistry(t)
	ref := reg.Host + "/test/late:1"
	c := shell("echo pulled")
	c.Image = ref
	pod := newPod("late", "uid-late", c)
	if err := p.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, p, "late", func(s *corev1.PodStatus) bool {
		w := s.ContainerStatuses[0].State.Waiting
		return s.Phase == corev1.PodPending && w != nil && w.Reason == "ImagePullBackOff" && w.Message == `Back-off pulling image "`+ref+`"`
	})
	reg.Push(t, "test/late:1", imagetest.Image(t, []string{"sh"}))
	st := waitStatus(t, p, "late", func(s *corev1.PodStatus) bool { return s.Phase == corev1.PodSucceeded || s.Phase == corev1.PodFailed })
	if st.Phase != corev1.PodSucceeded {
		t.Errorf("after the image was pushed: %s %+v", st.Phase, st.ContainerStatuses[0].State)
	}
}

// TestPodPortsPublished: a pod's containerPorts are published on the node
// (hostPort, else containerPort, on the node's IP); one that another
// process holds is reported in the PortsPublished condition (False,
// PortConflict) and the pod runs all the same.
func TestPodPortsPublished(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	p.SetAPI(kfake.NewClientset(), "127.0.0.1")
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldPort := held.Addr().(*net.TCPAddr).Port
	free := freeTCPPort(t)
	c := shell("sleep 100")
	c.Ports = []corev1.ContainerPort{{ContainerPort: 8000, HostPort: int32(free)}, {ContainerPort: int32(heldPort)}}
	pod := newPod("ports", "uid-ports", c)
	if err := p.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	defer p.DeletePod(context.Background(), pod)
	st := waitStatus(t, p, "ports", func(s *corev1.PodStatus) bool { return s.Phase == corev1.PodRunning })
	var cond *corev1.PodCondition
	for i := range st.Conditions {
		if st.Conditions[i].Type == kubenode.ConditionPortsPublished {
			cond = &st.Conditions[i]
		}
	}
	wantPub := fmt.Sprintf("127.0.0.1:%d->8000/TCP", free)
	wantConflict := fmt.Sprintf("127.0.0.1:%d->%d/TCP: ", heldPort, heldPort)
	if cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != kubenode.ReasonPortConflict ||
		!strings.Contains(cond.Message, wantConflict) || !strings.Contains(cond.Message, "published: "+wantPub) {
		t.Fatalf("PortsPublished condition = %+v; want False, %s, naming %q and %q", cond, kubenode.ReasonPortConflict, wantConflict, wantPub)
	}
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", free), 10*time.Second)
	if err != nil {
		t.Fatalf("the published port: %v", err)
	}
	conn.Close()
	if err := p.DeletePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	// Deleting the pod stops publishing.
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", free))
	if err != nil {
		t.Fatalf("the port after the pod's delete: %v", err)
	}
	l.Close()
}

// freeTCPPort returns a TCP port of 127.0.0.1 that nothing listens on now.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
