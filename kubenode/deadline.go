package kubenode

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A pod's spec.activeDeadlineSeconds is honoured as a kubelet honours it:
// once the pod has been active that long (from its status.startTime), it
// fails with reason DeadlineExceeded, whatever its restartPolicy; its
// command is killed and its box removed (the log stays for kubectl logs).
// The deadline may be set or lowered on a running pod (UpdatePod).

// ReasonDeadlineExceeded is the status.reason of a pod that ran past its
// activeDeadlineSeconds, and its container's terminated reason (exit 137).
const ReasonDeadlineExceeded = "DeadlineExceeded"

// deadlineMessage is the kubelet's status.message for ReasonDeadlineExceeded.
const deadlineMessage = "Pod was active on the node longer than the specified deadline"

// armDeadlineLocked (re)starts the timer of the pod's activeDeadlineSeconds
// (p.mu held): none without one, or for a pod that is done, deleted or
// refused.
func (p *Provider) armDeadlineLocked(pb *podBox) {
	if pb.deadlineTimer != nil {
		pb.deadlineTimer.Stop()
		pb.deadlineTimer = nil
	}
	if pb.activeDeadline == nil || pb.deleted || pb.deadline || pb.refused != "" {
		return
	}
	at := pb.startTime.Add(time.Duration(*pb.activeDeadline) * time.Second)
	pb.deadlineTimer = time.AfterFunc(time.Until(at), func() { p.deadlineExceeded(pb) })
}

// stopDeadlineLocked stops the pod's deadline timer (p.mu held).
func stopDeadlineLocked(pb *podBox) {
	if pb.deadlineTimer != nil {
		pb.deadlineTimer.Stop()
		pb.deadlineTimer = nil
	}
}

// deadlineExceeded fails a pod that ran past its activeDeadlineSeconds:
// its command is killed (the run's context), its ports closed and its box
// removed; the pod shows Failed with ReasonDeadlineExceeded and a Warning
// event says so. A pod that is done or deleted, or a node that stopped
// (the node that adopts the pod applies the deadline), is left alone.
func (p *Provider) deadlineExceeded(pb *podBox) {
	p.mu.Lock()
	select {
	case <-p.quit:
		p.mu.Unlock()
		return
	default:
	}
	if pb.deleted || pb.deadline || pb.refused != "" || (pb.exited && !pb.restarting) {
		p.mu.Unlock()
		return
	}
	pb.deadline = true
	pb.exited, pb.restarting, pb.finished = true, false, time.Now()
	pb.exitCode, pb.reason, pb.message = 137, ReasonDeadlineExceeded, deadlineMessage
	cancel := pb.cancel
	pod := pb.pod
	p.mu.Unlock()
	p.logf("pod %s/%s: %s", pod.Namespace, pod.Name, deadlineMessage)
	if cancel != nil {
		cancel()
	}
	p.event(pod, corev1.EventTypeWarning, ReasonDeadlineExceeded, deadlineMessage)
	p.closePorts(pb)
	ctx, cancelRm := context.WithTimeout(context.Background(), time.Minute)
	defer cancelRm()
	if err := p.removeBox(ctx, pod.UID); err != nil {
		p.logf("pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	p.changed(pb)
}
