package kubenode

import (
	"context"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The provider pushes pod statuses (virtual-kubelet's PodNotifier) when
// they change, so that the API shows a pod Running, or its end, at once
// instead of at virtual-kubelet's next 5 s poll; a resync every
// resyncInterval still catches what changes unseen (an adopted box's end).
// It does what virtual-kubelet's wrapper of a polled provider does: a pod
// it deletes is reported terminated, and a running pod it no longer knows
// fails with reason NotFound.

// resyncInterval is how often every pod's status is pushed again.
const resyncInterval = 5 * time.Second

// NotifyPods registers f, which receives a pod (its status up to date)
// whenever its status changes, and starts the resync until ctx ends. Part
// of virtual-kubelet's PodNotifier; it returns at once.
func (p *Provider) NotifyPods(ctx context.Context, f func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = f
	p.mu.Unlock()
	go p.resync(ctx)
}

// setListers gives the provider the informers' pods of this node, for
// the resync, and the cluster's ConfigMaps and Secrets, for the sync of
// volumes (syncVolumes).
func (p *Provider) setListers(pc nodeutil.ProviderConfig) {
	p.mu.Lock()
	p.lister, p.cmLister, p.secretLister = pc.Pods, pc.ConfigMaps, pc.Secrets
	p.mu.Unlock()
}

// changed pushes the pod's status, when a callback is registered.
func (p *Provider) changed(pb *podBox) {
	p.mu.Lock()
	f := p.notify
	if f == nil || pb.deleted {
		p.mu.Unlock()
		return
	}
	pod := pb.pod.DeepCopy()
	pod.Status = p.statusLocked(pb)
	p.mu.Unlock()
	f(pod)
}

// notifyDeleted reports a deleted pod as terminated, as virtual-kubelet
// expects of a provider once DeletePod returns (unless it had ended).
func (p *Provider) notifyDeleted(pod *corev1.Pod) {
	p.mu.Lock()
	f := p.notify
	p.mu.Unlock()
	if f == nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	f(terminated(pod, "the pod was deleted: its box was removed"))
}

// terminated returns the pod as deleted here: Succeeded, reason
// Terminated, its containers terminated with msg.
func terminated(pod *corev1.Pod, msg string) *corev1.Pod {
	u := pod.DeepCopy()
	u.Status.Phase, u.Status.Reason = corev1.PodSucceeded, "Terminated"
	now := metav1.Now()
	for i, cs := range u.Status.ContainerStatuses {
		t := &corev1.ContainerStateTerminated{Reason: "Terminated", Message: msg, FinishedAt: now}
		if cs.State.Running != nil {
			t.StartedAt = cs.State.Running.StartedAt
		}
		u.Status.ContainerStatuses[i].State = corev1.ContainerState{Terminated: t}
	}
	return u
}

// resync pushes the status of every pod of this node every resyncInterval.
func (p *Provider) resync(ctx context.Context) {
	t := time.NewTicker(resyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.resyncOnce(ctx)
	}
}

func (p *Provider) resyncOnce(ctx context.Context) {
	p.mu.Lock()
	l, f := p.lister, p.notify
	p.mu.Unlock()
	if l == nil || f == nil {
		return
	}
	pods, err := l.List(labels.Everything())
	if err != nil {
		return
	}
	live := map[string]bool{}
	for _, kp := range pods {
		k := key(kp.Namespace, kp.Name)
		live[k] = true
		if kp.Status.Phase == corev1.PodSucceeded || kp.Status.Phase == corev1.PodFailed {
			continue
		}
		st, err := p.GetPodStatus(ctx, kp.Namespace, kp.Name)
		if err == nil {
			pod := kp.DeepCopy()
			st.DeepCopyInto(&pod.Status)
			f(pod)
			continue
		}
		if !errdefs.IsNotFound(err) {
			continue
		}
		p.mu.Lock()
		_, gone := p.deletedKeys[k]
		p.mu.Unlock()
		// A pod being created is not known yet; one that ran and is not
		// known any more has lost its box: it fails, so that its
		// controller makes another.
		if gone || (kp.Status.Phase != corev1.PodRunning && time.Since(kp.CreationTimestamp.Time) <= time.Minute) {
			continue
		}
		pod := kp.DeepCopy()
		pod.Status.Phase, pod.Status.Reason = corev1.PodFailed, "NotFound"
		pod.Status.Message = "the pod's box is not known to this node: it may have been removed"
		now := metav1.Now()
		for i, cs := range pod.Status.ContainerStatuses {
			t := &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "NotFound", Message: pod.Status.Message, FinishedAt: now}
			if cs.State.Running != nil {
				t.StartedAt = cs.State.Running.StartedAt
			}
			pod.Status.ContainerStatuses[i].State = corev1.ContainerState{Terminated: t}
		}
		f(pod)
	}
	// Forget deletions of pods the API no longer has.
	p.mu.Lock()
	for k := range p.deletedKeys {
		if !live[k] {
			delete(p.deletedKeys, k)
		}
	}
	p.mu.Unlock()
}
