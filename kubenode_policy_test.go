package airlock_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/kubenode"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podLog returns what kubectl logs would show of the pod's container.
func podLog(t *testing.T, p *kubenode.Provider, name string) string {
	t.Helper()
	rc, err := p.GetContainerLogs(context.Background(), "default", name, "main", api.ContainerLogOpts{})
	if err != nil {
		t.Fatalf("logs of %s: %v", name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPodImagePullPolicy: imagePullPolicy as Kubernetes defines it, with a
// loopback registry whose tag moves from one image to another:
//   - Always pulls the image again: a pod gets the image the tag names
//     now, and its imageID is that image's digest;
//   - IfNotPresent uses the image in the node's store (the old one);
//   - Never uses the store's image, and a missing one leaves the pod
//     Pending in ErrImageNeverPull with the kubelet's message;
//   - Always with the registry gone is ErrImagePull, though the store has
//     the image.
func TestPodImagePullPolicy(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop) // after the pods' deletes: nothing of them runs on
	reg := imagetest.NewRegistry(t)
	ref := reg.Push(t, "test/moving:1", imagetest.Image(t, []string{"sh", "-c", "echo one"}))
	ctx := context.Background()
	run := func(name string, policy corev1.PullPolicy, image string) *corev1.PodStatus {
		t.Helper()
		pod := newPod(name, "uid-"+name, corev1.Container{Name: "main", Image: image, ImagePullPolicy: policy})
		if err := p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.DeletePod(context.Background(), pod) })
		return waitStatus(t, p, name, func(s *corev1.PodStatus) bool {
			return s.Phase == corev1.PodSucceeded || s.Phase == corev1.PodFailed
		})
	}
	first := run("always1", corev1.PullAlways, ref)
	if first.Phase != corev1.PodSucceeded || podLog(t, p, "always1") != "one\n" {
		t.Fatalf("always1: %s, log %q", first.Phase, podLog(t, p, "always1"))
	}
	id1 := first.ContainerStatuses[0].ImageID
	if !strings.HasPrefix(id1, reg.Host+"/test/moving@sha256:") {
		t.Fatalf("always1: imageID %q, want the repository @ the digest", id1)
	}

	// The tag moves in the registry.
	reg.Push(t, "test/moving:1", imagetest.Image(t, []string{"sh", "-c", "echo two"}))
	if st := run("ifnotpresent", corev1.PullIfNotPresent, ref); podLog(t, p, "ifnotpresent") != "one\n" || st.ContainerStatuses[0].ImageID != id1 {
		t.Errorf("IfNotPresent: log %q, imageID %q; want the stored image's (one, %s)", podLog(t, p, "ifnotpresent"), st.ContainerStatuses[0].ImageID, id1)
	}
	st := run("always2", corev1.PullAlways, ref)
	if got := podLog(t, p, "always2"); got != "two\n" {
		t.Errorf("Always after the tag moved: log %q, want the new image's", got)
	}
	if id2 := st.ContainerStatuses[0].ImageID; id2 == id1 || !strings.HasPrefix(id2, reg.Host+"/test/moving@sha256:") {
		t.Errorf("Always after the tag moved: imageID %q (before: %q)", id2, id1)
	}
	if run("never", corev1.PullNever, ref); podLog(t, p, "never") != "two\n" {
		t.Errorf("Never with the image in the store: log %q", podLog(t, p, "never"))
	}

	// Never, and the image is not in the store: no pull, the pod waits.
	missing := reg.Push(t, "test/elsewhere:1", imagetest.Image(t, []string{"true"}))
	nopull := newPod("nopull", "uid-nopull", corev1.Container{Name: "main", Image: missing, ImagePullPolicy: corev1.PullNever})
	if err := p.CreatePod(ctx, nopull); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.DeletePod(context.Background(), nopull) })
	waitStatus(t, p, "nopull", func(s *corev1.PodStatus) bool {
		w := s.ContainerStatuses[0].State.Waiting
		return s.Phase == corev1.PodPending && w != nil && w.Reason == kubenode.ReasonErrImageNeverPull &&
			w.Message == `Container image "`+missing+`" is not present with pull policy of Never`
	})
	if _, err := rt.LocalImage(missing); !errors.Is(err, airlock.ErrImageNotFound) {
		t.Errorf("the image of a Never pod was pulled: %v", err)
	}

	// Always with the registry gone: a pull error, not the stored image.
	reg.Server.Close()
	offline := newPod("offline", "uid-offline", corev1.Container{Name: "main", Image: ref, ImagePullPolicy: corev1.PullAlways})
	if err := p.CreatePod(ctx, offline); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.DeletePod(context.Background(), offline) })
	waitStatus(t, p, "offline", func(s *corev1.PodStatus) bool {
		w := s.ContainerStatuses[0].State.Waiting
		return s.Phase == corev1.PodPending && w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff")
	})
}

// TestPodActiveDeadline: a pod that runs past its activeDeadlineSeconds
// fails with reason DeadlineExceeded whatever its restartPolicy, its
// container terminated (137), its box removed and its log kept; a
// deadline set lower on a running pod (UpdatePod) applies; a pod done
// before its deadline stays Succeeded.
func TestPodActiveDeadline(t *testing.T) {
	rt := kubeRuntime(t)
	p, err := kubenode.NewProvider(rt, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop) // after the pods' deletes: nothing of them runs on
	ctx := context.Background()
	secs := func(n int64) *int64 { return &n }
	failedByDeadline := func(s *corev1.PodStatus) bool {
		return s.Phase == corev1.PodFailed
	}
	check := func(name string, st *corev1.PodStatus) {
		t.Helper()
		term := st.ContainerStatuses[0].State.Terminated
		if st.Reason != kubenode.ReasonDeadlineExceeded || st.Message != "Pod was active on the node longer than the specified deadline" ||
			term == nil || term.ExitCode != 137 || term.Reason != kubenode.ReasonDeadlineExceeded {
			t.Fatalf("%s: reason %q, message %q, terminated %+v", name, st.Reason, st.Message, term)
		}
		eventually(t, 30*time.Second, func() string {
			if _, err := rt.Get(ctx, kubenode.BoxName(types.UID("uid-"+name))); !errors.Is(err, airlock.ErrBoxNotFound) {
				return name + ": the box after the deadline: " + errString(err)
			}
			return ""
		})
	}

	c := shell("echo started; sleep 100")
	pod := newPod("short", "uid-short", c)
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	pod.Spec.ActiveDeadlineSeconds = secs(2)
	if err := p.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.DeletePod(context.Background(), pod) })
	check("short", waitStatus(t, p, "short", failedByDeadline))
	if got := podLog(t, p, "short"); got != "started\n" {
		t.Errorf("short: log after the deadline %q", got)
	}

	// Lowered while it runs.
	long := newPod("lowered", "uid-lowered", shell("sleep 100"))
	long.Spec.ActiveDeadlineSeconds = secs(3600)
	if err := p.CreatePod(ctx, long); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.DeletePod(context.Background(), long) })
	waitStatus(t, p, "lowered", func(s *corev1.PodStatus) bool { return s.Phase == corev1.PodRunning })
	upd := long.DeepCopy()
	upd.Spec.ActiveDeadlineSeconds = secs(1)
	if err := p.UpdatePod(ctx, upd); err != nil {
		t.Fatal(err)
	}
	check("lowered", waitStatus(t, p, "lowered", failedByDeadline))

	// Done before its deadline, which is then lowered to a time past:
	// it stays Succeeded.
	quick := newPod("quick", "uid-quick", shell("true"))
	quick.Spec.ActiveDeadlineSeconds = secs(3600)
	if err := p.CreatePod(ctx, quick); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.DeletePod(context.Background(), quick) })
	st := waitStatus(t, p, "quick", func(s *corev1.PodStatus) bool { return s.Phase == corev1.PodSucceeded || s.Phase == corev1.PodFailed })
	if st.Phase != corev1.PodSucceeded {
		t.Fatalf("quick: %s %s", st.Phase, st.Reason)
	}
	upd = quick.DeepCopy()
	upd.Spec.ActiveDeadlineSeconds = secs(1)
	if err := p.UpdatePod(ctx, upd); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if st, err := p.GetPodStatus(ctx, "default", "quick"); err != nil || st.Phase != corev1.PodSucceeded {
			t.Fatalf("quick after its deadline passed: %v %+v", err, st)
		}
	}
}
