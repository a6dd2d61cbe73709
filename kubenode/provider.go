package kubenode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/kubebox"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
)

// Provider runs the pods bound to one node as airlock boxes: one box per
// pod, named BoxName(pod UID), running the pod's one container's command as
// the box's main command (airlock.ExecOptions.Main). It implements
// virtual-kubelet's nodeutil.Provider; status is polled by virtual-kubelet
// (GetPodStatus), not pushed.
type Provider struct {
	rt     *airlock.Runtime
	logDir string
	logf   func(format string, args ...any)

	nodeName        string               // for /stats/summary
	started         time.Time            // when the provider was made
	client          kubernetes.Interface // resolves env valueFrom/envFrom (SetAPI); nil: refused
	hostIP          string               // the node's InternalIP (status.hostIP)
	allowVolumeDirs []string             // SetAllowVolumeDirs
	recorder        record.EventRecorder // the pods' events (SetRecorder); nil: none

	mu           sync.Mutex
	pods         map[string]*podBox // by namespace/name
	cpuLast      map[types.UID]cpuSample
	nodeCPULast  cpuSample
	notify       func(*corev1.Pod)             // NotifyPods' callback
	lister       corev1listers.PodLister       // this node's pods, for the resync
	cmLister     corev1listers.ConfigMapLister // for syncVolumes
	secretLister corev1listers.SecretLister
	deletedKeys  map[string]struct{} // pods deleted here that the API still lists

	quit     chan struct{} // closed by Stop: no container restarts any more
	quitOnce sync.Once
}

// podBox is one pod and the state of its box.
type podBox struct {
	pod    *corev1.Pod // as created; Status is rebuilt by status()
	cancel context.CancelFunc

	// Set at creation (CreatePod, Adopt), then read only.
	startTime time.Time // status.startTime: the API's, else when this node took the pod

	// Guarded by Provider.mu.
	refused   string // why the pod was refused (checkPod), or ""
	waiting   string // waiting reason while not started ("ContainerCreating", "ErrImagePull")
	message   string
	box       *airlock.Box
	started   time.Time
	finished  time.Time
	exited    bool
	exitCode  int
	reason    string // terminated reason
	adopted   bool   // found running at restart: its main command's end is read from the box record
	deleted   bool
	startedCh chan struct{}

	// Restarts (restartPolicy OnFailure, Always).
	restarting   bool                             // exited; the container runs again after a back-off
	restartCount int                              // times the container was started again
	last         *corev1.ContainerStateTerminated // the previous run's end (lastState)
	backoff      time.Duration                    // the next restart's back-off (0: at once)

	ports  *podPorts // the published containerPorts (publishPorts), or nil
	resume bool      // adopted and not done: resumeAdopted takes it over

	imageID string // the image as resolved (digestRef); "" until then

	// secrets are the values of a box made through the API
	// (kubebox.Options.Secrets), read by resolvePodEnv; only run uses them.
	secrets map[string]airlock.Secret

	// activeDeadlineSeconds (deadline.go).
	activeDeadline *int64      // the pod's, updated by UpdatePod
	deadlineTimer  *time.Timer // fires deadlineExceeded; nil without a deadline
	deadline       bool        // the deadline passed: the pod failed, its box was removed
}

// NewProvider returns a provider that runs pods as boxes of rt. Container
// output is kept in logDir (one file per pod, removed with the pod); logf,
// when set, receives one line per event worth telling an operator.
func NewProvider(rt *airlock.Runtime, logDir string, logf func(string, ...any)) (*Provider, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return nil, err
	}
	return &Provider{rt: rt, logDir: logDir, logf: logf, pods: map[string]*podBox{}, started: time.Now(), quit: make(chan struct{})}, nil
}

// Stop ends the provider's work when its node stops: no container is
// started again, no port published, no volume synced, and the commands
// it runs end (as they end with the node process that runs them). The
// boxes stay, for a node that adopts them. Run calls it when the node
// stops.
func (p *Provider) Stop() {
	p.quitOnce.Do(func() {
		close(p.quit)
		p.mu.Lock()
		var cancels []context.CancelFunc
		var ports []*podPorts
		for _, pb := range p.pods {
			if pb.cancel != nil {
				cancels = append(cancels, pb.cancel)
			}
			ports = append(ports, pb.ports)
		}
		p.mu.Unlock()
		for _, c := range cancels {
			c()
		}
		for _, pp := range ports {
			pp.close()
		}
	})
}

// SetAllowVolumeDirs sets the host directories under which a pod made
// through the API may attach host directory volumes (airlock node
// --allow-volume); none by default. Call it before CreatePod.
func (p *Provider) SetAllowVolumeDirs(dirs []string) { p.allowVolumeDirs = dirs }

// SetAPI gives the provider the cluster's API, through which a pod's env
// valueFrom and envFrom are resolved (ConfigMaps, Secrets, the downward
// API; see resolveEnv), and the node's IP, the pods' status.hostIP.
// Without it, pods with such env are refused. Call it before CreatePod.
func (p *Provider) SetAPI(client kubernetes.Interface, hostIP string) {
	p.client, p.hostIP = client, hostIP
}

// SetRecorder gives the provider the recorder of the pods' events
// (pull failures, starts, kills, port conflicts). Call it before
// CreatePod.
func (p *Provider) SetRecorder(r record.EventRecorder) { p.recorder = r }

// event records an event of the pod, when there is a recorder.
func (p *Provider) event(pod *corev1.Pod, typ, reason, msg string) {
	if p.recorder != nil {
		p.recorder.Event(pod, typ, reason, msg)
	}
}

func key(namespace, name string) string { return namespace + "/" + name }

func (p *Provider) logPath(uid types.UID) string { return filepath.Join(p.logDir, string(uid)+".log") }

// prevLogPath is the log of the container's previous run (`kubectl logs
// --previous`), kept from its restart until the next.
func (p *Provider) prevLogPath(uid types.UID) string {
	return filepath.Join(p.logDir, string(uid)+".previous.log")
}

// CreatePod starts the pod's box in the background and returns: the pod
// is Pending (ContainerCreating) until the box runs its command. A pod
// this node cannot honour is recorded as Failed with ReasonUnsupported.
func (p *Provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	pod = pod.DeepCopy()
	k := key(pod.Namespace, pod.Name)
	p.mu.Lock()
	if old, ok := p.pods[k]; ok && old.pod.UID == pod.UID {
		p.mu.Unlock()
		return nil
	}
	pb := &podBox{pod: pod, waiting: "ContainerCreating", startedCh: make(chan struct{}),
		startTime: time.Now(), activeDeadline: pod.Spec.ActiveDeadlineSeconds}
	if t := pod.Status.StartTime; t != nil {
		pb.startTime = t.Time
	}
	why := checkPod(pod)
	if why == "" && p.client == nil {
		why = checkEnvRefs(pod)
	}
	if why != "" {
		pb.refused, pb.message = ReasonUnsupported, why
		p.pods[k] = pb
		p.mu.Unlock()
		p.logf("pod %s refused: %s", k, why)
		p.changed(pb)
		return nil
	}
	runCtx, cancel := context.WithCancel(context.Background())
	pb.cancel = cancel
	p.pods[k] = pb
	p.armDeadlineLocked(pb)
	p.mu.Unlock()
	go p.run(runCtx, pb)
	return nil
}

// run creates the pod's box, runs its command as the box's main command
// with its output in the pod's log file, and records the end.
func (p *Provider) run(ctx context.Context, pb *podBox) {
	pod := pb.pod
	fail := func(reason, msg string) { p.fail(pb, reason, msg) }
	var files []volumeFile
	if p.client != nil {
		var ok bool
		if pod, files, ok = p.resolvePodEnv(ctx, pb); !ok {
			return
		}
	} else {
		// Only emptyDirs: without the API, pods with other volumes are
		// refused (checkEnvRefs).
		files, _ = resolveVolumes(ctx, nil, pod, &pod.Spec.Containers[0])
	}
	opts, err := boxOptions(pod)
	if err != nil {
		fail(ReasonStartError, err.Error())
		return
	}
	opts.Secrets = pb.secrets
	if err := checkHostVolumes(&opts, p.allowVolumeDirs); err != nil {
		fail(kubebox.ReasonPolicyDenied, err.Error())
		return
	}
	box, ok := p.createBox(ctx, pb, opts)
	if !ok {
		return
	}
	p.mu.Lock()
	pb.box = box
	deleted, deadline := pb.deleted, pb.deadline
	p.mu.Unlock()
	if deadline {
		// Made as the deadline passed: deadlineExceeded may have looked
		// for it before it was there.
		p.removeBox(context.Background(), pod.UID)
	}
	if deleted || deadline {
		return
	}
	if err := writeVolumes(ctx, box, pod, files); err != nil {
		if ctx.Err() == nil {
			fail(ReasonStartError, err.Error())
		}
		return
	}
	p.publishPorts(pb, box)
	if apiBox(pod) {
		// A box made through the API runs no main command: the pod
		// runs while the box does, read from its record as an adopted
		// box's (statusLocked), until the pod is deleted.
		p.mu.Lock()
		pb.started, pb.waiting, pb.message, pb.adopted = time.Now(), "", "", true
		close(pb.startedCh)
		p.mu.Unlock()
		p.logf("pod %s/%s: box %s runs (made through the API)", pod.Namespace, pod.Name, box.ID())
		p.changed(pb)
		return
	}
	if p.client != nil && hasAPIVolumes(pod) {
		syncCtx, stopSync := context.WithCancel(ctx)
		defer stopSync()
		go p.syncVolumes(syncCtx, pb, box, files)
	}
	entry, cmd := box.ImageCommand()
	argv, err := command(&pod.Spec.Containers[0], entry, cmd)
	if err != nil {
		fail(ReasonStartError, err.Error())
		return
	}
	for {
		code, ok := p.runOnce(ctx, pb, box, argv)
		if !ok {
			return
		}
		if !restarts(pod.Spec.RestartPolicy, code) {
			break
		}
		if !p.restart(ctx, pb, box) {
			return
		}
	}
	p.done(pb, box)
}

// done stops the box of a pod that is done (its writable layer stays until
// the pod is deleted) and its published ports.
func (p *Provider) done(pb *podBox, box *airlock.Box) {
	pod := pb.pod
	p.closePorts(pb)
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := box.Stop(stopCtx); err != nil {
		p.logf("pod %s/%s: stopping box %s: %v", pod.Namespace, pod.Name, box.ID(), err)
	}
}

// Back-off between pulls of an image that could not be pulled, as a
// kubelet's: pullBackoff, doubling up to maxPullBackoff.
const (
	pullBackoff    = 10 * time.Second
	maxPullBackoff = 5 * time.Minute
	// pullErrShown is how long a failed pull shows as ErrImagePull
	// before the wait shows as ImagePullBackOff.
	pullErrShown = 2 * time.Second
)

// createBox creates the pod's box from its image, found as the
// container's imagePullPolicy says (resolveImage). An image that cannot
// be pulled leaves the container waiting as a kubelet leaves it:
// ErrImagePull, then ImagePullBackOff until the next pull, after a
// back-off (pullBackoff doubling to maxPullBackoff), with events Failed
// and BackOff; it is pulled again until it can be or the pod is deleted.
// An image absent under policy Never leaves it waiting in
// ErrImageNeverPull, looked for again every neverPullRetry. Any other
// error ends the container (StartError). ok false: no box (the pod was
// deleted or failed).
func (p *Provider) createBox(ctx context.Context, pb *podBox, opts airlock.BoxOptions) (*airlock.Box, bool) {
	pod := pb.pod
	ref := opts.Image
	wait := time.Duration(0)
	for {
		info, err := p.resolveImage(ctx, pod)
		if err == nil {
			// Create finds the image just resolved under its name in the
			// store (the box's image shows the name the pod gave).
			p.mu.Lock()
			pb.imageID = digestRef(info)
			if wait > 0 {
				pb.waiting, pb.message = "ContainerCreating", ""
			}
			p.mu.Unlock()
			if wait > 0 {
				p.changed(pb)
			}
			var box *airlock.Box
			if box, err = p.rt.Create(ctx, opts); err == nil {
				return box, true
			}
		}
		if ctx.Err() != nil {
			return nil, false
		}
		var never *neverPullError
		if errors.As(err, &never) {
			wait = neverPullRetry
			p.mu.Lock()
			changed := pb.waiting != ReasonErrImageNeverPull
			pb.waiting, pb.message = ReasonErrImageNeverPull, never.Error()
			p.mu.Unlock()
			if changed {
				p.logf("pod %s/%s: %s: %s", pod.Namespace, pod.Name, ReasonErrImageNeverPull, never.Error())
				p.changed(pb)
			}
			p.event(pod, corev1.EventTypeWarning, ReasonErrImageNeverPull, never.Error())
			if !sleepCtx(ctx, wait) {
				return nil, false
			}
			continue
		}
		if !errors.Is(err, airlock.ErrImageNotFound) {
			p.fail(pb, ReasonStartError, err.Error())
			return nil, false
		}
		wait = min(max(2*wait, pullBackoff), maxPullBackoff)
		p.fail(pb, "ErrImagePull", err.Error())
		p.event(pod, corev1.EventTypeWarning, "Failed", fmt.Sprintf("Failed to pull image %q: %v", ref, err))
		if !sleepCtx(ctx, min(pullErrShown, wait)) {
			return nil, false
		}
		p.mu.Lock()
		pb.waiting, pb.message = "ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q", ref)
		p.mu.Unlock()
		p.changed(pb)
		p.event(pod, corev1.EventTypeNormal, "BackOff", fmt.Sprintf("Back-off pulling image %q", ref))
		if !sleepCtx(ctx, wait-min(pullErrShown, wait)) {
			return nil, false
		}
	}
}

// sleepCtx waits d, or until ctx ends (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// restarts reports whether a container that exited with code runs again
// under the pod's restartPolicy (empty is Always, the API's default).
func restarts(policy corev1.RestartPolicy, code int) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return true
}

// Back-off between restarts of a container, as a kubelet's: the first
// restart is at once, the next after restartBackoff, doubling up to
// maxRestartBackoff; a run of backoffReset or longer starts over.
const (
	restartBackoff    = 10 * time.Second
	maxRestartBackoff = 5 * time.Minute
	backoffReset      = 10 * time.Minute
)

// runOnce runs the container's command once as the box's main command,
// its output appended to the pod's log, and records its end. It returns
// the exit code, or ok false when the pod was deleted or the command could
// not be started (recorded as its end).
func (p *Provider) runOnce(ctx context.Context, pb *podBox, box *airlock.Box, argv []string) (code int, ok bool) {
	pod := pb.pod
	logf, err := os.OpenFile(p.logPath(pod.UID), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.fail(pb, ReasonStartError, err.Error())
		return 0, false
	}
	w := &podLog{f: logf, path: p.logPath(pod.UID), max: maxPodLogBytes}
	if st, err := logf.Stat(); err == nil {
		w.size = st.Size()
	}
	defer w.Close()
	proc, err := box.ExecStream(ctx, argv[0], argv[1:], airlock.ExecOptions{Main: true, Stdout: w.stream("stdout"), Stderr: w.stream("stderr")})
	if err != nil {
		if ctx.Err() == nil {
			p.fail(pb, ReasonStartError, err.Error())
		}
		return 0, false
	}
	p.mu.Lock()
	pb.started, pb.waiting, pb.message = time.Now(), "", ""
	if pb.last == nil {
		close(pb.startedCh)
	}
	p.mu.Unlock()
	p.logf("pod %s/%s: box %s runs %q", pod.Namespace, pod.Name, box.ID(), argv)
	p.event(pod, corev1.EventTypeNormal, "Started", fmt.Sprintf("Started container %s in box %s", pod.Spec.Containers[0].Name, box.ID()))
	p.changed(pb)
	res, err := proc.Wait()
	if ctx.Err() != nil { // deleted: DeletePod removes the box
		return 0, false
	}
	p.mu.Lock()
	if pb.deadline {
		p.mu.Unlock()
		return 0, false
	}
	pb.exited, pb.finished = true, time.Now()
	pb.reason, pb.message = "", ""
	switch {
	case err != nil:
		pb.exitCode, pb.reason, pb.message = 137, ReasonBoxDied, err.Error()
	case res.OOMKilled:
		pb.exitCode, pb.reason = res.ExitCode, "OOMKilled"
	default:
		pb.exitCode, pb.reason = res.ExitCode, "Completed"
		if res.ExitCode != 0 {
			pb.reason = "Error"
		}
		if res.ErrorMessage != "" {
			pb.message = res.ErrorMessage
		}
	}
	code = pb.exitCode
	if restarts(pod.Spec.RestartPolicy, code) {
		// Shown as waiting (CrashLoopBackOff while backing off) with
		// this run as lastState, from the moment the run ends.
		if pb.finished.Sub(pb.started) >= backoffReset {
			pb.backoff = 0
		}
		pb.restarting = true
		pb.waiting, pb.message = "ContainerCreating", ""
		if pb.backoff > 0 {
			pb.waiting = "CrashLoopBackOff"
			pb.message = fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)",
				pb.backoff, pod.Spec.Containers[0].Name, pod.Name, pod.Namespace, pod.UID)
		}
	}
	p.mu.Unlock()
	p.logf("pod %s/%s: command exited with status %d", pod.Namespace, pod.Name, code)
	p.changed(pb)
	return code, true
}

// restart waits out the container's back-off, then starts its box again
// (a new boot: no process of the last run is left; files stay) and moves
// the last run's log aside for `kubectl logs --previous`. It returns false
// when the pod was deleted or the box could not be started again.
func (p *Provider) restart(ctx context.Context, pb *podBox, box *airlock.Box) bool {
	pod := pb.pod
	p.mu.Lock()
	wait := pb.backoff
	pb.backoff = min(max(2*pb.backoff, restartBackoff), maxRestartBackoff)
	p.mu.Unlock()
	if wait > 0 {
		p.logf("pod %s/%s: back-off %s before restarting the container", pod.Namespace, pod.Name, wait)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-p.quit:
		return false
	case <-t.C:
	}
	p.mu.Lock()
	pb.last = p.terminatedLocked(pb)
	pb.exited, pb.restarting, pb.started = false, false, time.Time{}
	pb.reason, pb.exitCode = "", 0
	pb.waiting, pb.message = "ContainerCreating", ""
	pb.restartCount++
	p.mu.Unlock()
	p.changed(pb)
	cur, prev := p.logPath(pod.UID), p.prevLogPath(pod.UID)
	os.Remove(prev + ".1")
	os.Rename(cur, prev)
	os.Rename(cur+".1", prev+".1")
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := box.Stop(stopCtx)
	cancel()
	if err == nil {
		err = box.Start(ctx)
	}
	if err != nil {
		if ctx.Err() == nil {
			p.fail(pb, ReasonStartError, "restarting the box: "+err.Error())
		}
		return false
	}
	return true
}

// fail records that the pod's container could not be started: an image
// that cannot be pulled leaves it waiting (ErrImagePull); anything else
// ends it with reason and msg.
func (p *Provider) fail(pb *podBox, reason, msg string) {
	pod := pb.pod
	p.mu.Lock()
	if pb.deadline {
		p.mu.Unlock()
		return
	}
	if reason == "ErrImagePull" {
		pb.waiting, pb.message = reason, msg
	} else {
		pb.exited, pb.exitCode, pb.reason, pb.message, pb.finished = true, 128, reason, msg, time.Now()
		pb.restarting = false
	}
	p.mu.Unlock()
	p.logf("pod %s/%s: %s: %s", pod.Namespace, pod.Name, reason, msg)
	p.changed(pb)
}

// resolvePodEnv returns the pod with its container's env resolved
// (resolveEnv) and the files of its volumes (resolveVolumes). While they
// cannot be made, the pod waits with the kubelet's reason
// (ReasonConfigError for env, ContainerCreating for a volume) and
// message, and is tried again (every configRetry at most) until they can
// or the pod is deleted (ok false).
func (p *Provider) resolvePodEnv(ctx context.Context, pb *podBox) (*corev1.Pod, []volumeFile, bool) {
	wait := time.Second
	for {
		c := &pb.pod.Spec.Containers[0]
		env, err := resolveEnv(ctx, p.client, pb.pod, c, p.hostIP)
		var files []volumeFile
		if err == nil {
			files, err = resolveVolumes(ctx, p.client, pb.pod, c)
		}
		var secrets map[string]airlock.Secret
		if err == nil {
			secrets, err = boxSecrets(ctx, p.client, pb.pod)
		}
		if err == nil {
			pb.secrets = secrets
			pod := pb.pod.DeepCopy()
			pod.Spec.Containers[0].Env, pod.Spec.Containers[0].EnvFrom = env, nil
			p.mu.Lock()
			pb.waiting, pb.message = "ContainerCreating", ""
			p.mu.Unlock()
			return pod, files, true
		}
		if ctx.Err() != nil {
			return nil, nil, false
		}
		reason := ReasonConfigError
		var ve *volumeError
		if errors.As(err, &ve) {
			reason = "ContainerCreating"
		}
		p.mu.Lock()
		changed := pb.message != err.Error()
		pb.waiting, pb.message = reason, err.Error()
		p.mu.Unlock()
		if changed {
			p.logf("pod %s/%s: %s: %v", pb.pod.Namespace, pb.pod.Name, reason, err)
			p.changed(pb)
		}
		select {
		case <-ctx.Done():
			return nil, nil, false
		case <-time.After(wait):
		}
		wait = min(2*wait, configRetry)
	}
}

// UpdatePod accepts the updates Kubernetes allows on a running pod
// (labels, annotations, activeDeadlineSeconds): a new
// activeDeadlineSeconds restarts the pod's deadline from its start time;
// the others do not change the box.
func (p *Provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	pb, ok := p.pods[key(pod.Namespace, pod.Name)]
	if !ok || pb.pod.UID != pod.UID {
		return nil
	}
	old, now := pb.activeDeadline, pod.Spec.ActiveDeadlineSeconds
	if (old == nil) != (now == nil) || (old != nil && *old != *now) {
		if now != nil {
			v := *now
			now = &v
		}
		pb.activeDeadline = now
		p.armDeadlineLocked(pb)
	}
	return nil
}

// DeletePod kills the pod's command and removes its box (VM, writable
// layer, record) and its log. Deleting a pod the provider does not know is
// errdefs.NotFound, as virtual-kubelet expects.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	k := key(pod.Namespace, pod.Name)
	p.mu.Lock()
	pb, ok := p.pods[k]
	if ok && pb.pod.UID != pod.UID {
		ok = false
	}
	var cancel context.CancelFunc
	if ok {
		cancel = pb.cancel
		pb.deleted = true
		stopDeadlineLocked(pb)
		delete(p.pods, k)
		if p.deletedKeys == nil {
			p.deletedKeys = map[string]struct{}{}
		}
		p.deletedKeys[k] = struct{}{}
	}
	p.mu.Unlock()
	if !ok {
		// A box of this pod may exist without an entry (a node restarted
		// before it adopted the box): remove it all the same.
		if err := p.removeBox(ctx, pod.UID); err != nil {
			return err
		}
		return errdefs.NotFoundf("pod %s is not known to this node", k)
	}
	if cancel != nil {
		cancel()
	}
	p.event(pb.pod, corev1.EventTypeNormal, "Killing", fmt.Sprintf("Stopping container %s: its box is removed", pb.pod.Spec.Containers[0].Name))
	p.closePorts(pb)
	if err := p.removeBox(ctx, pod.UID); err != nil {
		return err
	}
	for _, f := range []string{p.logPath(pod.UID), p.prevLogPath(pod.UID)} {
		os.Remove(f)
		os.Remove(f + ".1")
	}
	p.logf("pod %s deleted: box %s removed", k, BoxName(pod.UID))
	p.notifyDeleted(pod)
	return nil
}

// removeBox removes the box of the pod with this UID, if there is one.
func (p *Provider) removeBox(ctx context.Context, uid types.UID) error {
	err := p.rt.Remove(ctx, BoxName(uid), true)
	if err != nil && !errors.Is(err, airlock.ErrBoxNotFound) {
		return fmt.Errorf("removing box %s: %w", BoxName(uid), err)
	}
	return nil
}

// GetPod returns the pod with its current status, or errdefs.NotFound.
func (p *Provider) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pb, ok := p.pods[key(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not known to this node", namespace, name)
	}
	pod := pb.pod.DeepCopy()
	pod.Status = p.statusLocked(pb)
	return pod, nil
}

// GetPodStatus returns the pod's status, or errdefs.NotFound.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns every pod the provider runs, with its status.
func (p *Provider) GetPods(ctx context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, pb := range p.pods {
		pod := pb.pod.DeepCopy()
		pod.Status = p.statusLocked(pb)
		out = append(out, pod)
	}
	return out, nil
}

// statusLocked builds the pod's status from its box's state (p.mu held).
func (p *Provider) statusLocked(pb *podBox) corev1.PodStatus {
	pod := pb.pod
	if pb.adopted && !pb.exited && pb.box != nil {
		p.refreshAdoptedLocked(pb)
	}
	st := corev1.PodStatus{QOSClass: pod.Status.QOSClass, HostIP: pod.Status.HostIP, StartTime: pod.Status.StartTime}
	if p.hostIP != "" {
		st.HostIP, st.HostIPs = p.hostIP, []corev1.HostIP{{IP: p.hostIP}}
	}
	if st.StartTime == nil {
		t := metav1.NewTime(pb.startTime)
		if pb.startTime.IsZero() {
			t = metav1.NewTime(pod.CreationTimestamp.Time)
		}
		st.StartTime = &t
	}
	created := metav1.NewTime(pod.CreationTimestamp.Time)
	cond := func(t corev1.PodConditionType, ok bool, at metav1.Time) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: at}
	}
	if pb.refused != "" {
		st.Phase, st.Reason, st.Message = corev1.PodFailed, pb.refused, pb.message
		st.Conditions = []corev1.PodCondition{cond(corev1.PodScheduled, true, created)}
		return st
	}
	c := pod.Spec.Containers[0]
	cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: pb.imageID}
	if pb.box != nil {
		cs.ContainerID = "airlock://" + pb.box.ID()
	}
	cs.RestartCount = int32(pb.restartCount)
	if pb.last != nil {
		cs.LastTerminationState.Terminated = pb.last.DeepCopy()
	}
	if pb.box != nil && p.hostIP != "" {
		// A box has no address of its own that the cluster can route to
		// (its network is the host's user-mode stack): it is reached
		// through its node, as a hostNetwork pod is (see docs/kubernetes.md).
		st.PodIP, st.PodIPs = p.hostIP, []corev1.PodIP{{IP: p.hostIP}}
	}
	switch {
	case pb.exited && pb.restarting:
		// Ended; runs again after its back-off (restartPolicy).
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: pb.waiting, Message: pb.message}
		cs.LastTerminationState.Terminated = p.terminatedLocked(pb)
		st.Phase = corev1.PodRunning
		done := metav1.NewTime(pb.finished)
		st.Conditions = []corev1.PodCondition{cond(corev1.PodScheduled, true, created), cond(corev1.PodInitialized, true, created),
			cond(corev1.ContainersReady, false, done), cond(corev1.PodReady, false, done)}
	case pb.exited:
		cs.State.Terminated = p.terminatedLocked(pb)
		st.Phase = corev1.PodSucceeded
		if pb.exitCode != 0 || pb.reason != "Completed" {
			st.Phase = corev1.PodFailed
		}
		if pb.deadline || (pb.started.IsZero() && pb.last == nil) {
			st.Reason, st.Message = pb.reason, pb.message
		}
		done := metav1.NewTime(pb.finished)
		st.Conditions = []corev1.PodCondition{cond(corev1.PodScheduled, true, created), cond(corev1.PodInitialized, true, created),
			cond(corev1.ContainersReady, false, done), cond(corev1.PodReady, false, done)}
	case !pb.started.IsZero():
		started := true
		cs.Started, cs.Ready = &started, true
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(pb.started)}
		st.Phase = corev1.PodRunning
		at := metav1.NewTime(pb.started)
		st.Conditions = []corev1.PodCondition{cond(corev1.PodScheduled, true, created), cond(corev1.PodInitialized, true, created),
			cond(corev1.ContainersReady, true, at), cond(corev1.PodReady, true, at)}
	default:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: pb.waiting, Message: pb.message}
		st.Phase = corev1.PodPending
		if pb.last != nil {
			st.Phase = corev1.PodRunning // between two runs
		}
		st.Conditions = []corev1.PodCondition{cond(corev1.PodScheduled, true, created), cond(corev1.PodInitialized, true, created),
			cond(corev1.ContainersReady, false, created), cond(corev1.PodReady, false, created)}
	}
	st.ContainerStatuses = []corev1.ContainerStatus{cs}
	if c := pb.ports.condition(created); c != nil {
		st.Conditions = append(st.Conditions, *c)
	}
	return st
}

// closePorts stops publishing the pod's ports.
func (p *Provider) closePorts(pb *podBox) {
	p.mu.Lock()
	pp := pb.ports
	p.mu.Unlock()
	pp.close()
}

// terminatedLocked is the container's last end as the API shows it
// (p.mu held).
func (p *Provider) terminatedLocked(pb *podBox) *corev1.ContainerStateTerminated {
	id := ""
	if pb.box != nil {
		id = "airlock://" + pb.box.ID()
	}
	return &corev1.ContainerStateTerminated{
		ExitCode: int32(pb.exitCode), Reason: pb.reason, Message: pb.message,
		StartedAt: metav1.NewTime(pb.started), FinishedAt: metav1.NewTime(pb.finished), ContainerID: id,
	}
}

// deleteAPIPod deletes the pod of a box made through the API whose box
// was removed on this node (at once: there is no process to let end).
func (p *Provider) deleteAPIPod(pod *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := int64(0)
	err := p.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
		Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.logf("pod %s/%s: its box was removed, the pod not deleted: %v", pod.Namespace, pod.Name, err)
		return
	}
	p.logf("pod %s/%s deleted: its box was removed on this node", pod.Namespace, pod.Name)
}

// refreshAdoptedLocked reads the end of an adopted box's main command from
// the box record (the process that ran it is gone; airlock records the end
// of a main command, or the VM's death, with the box).
func (p *Provider) refreshAdoptedLocked(pb *podBox) {
	if pb.deadline {
		return // ended by its deadline; its box was removed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := pb.box.Info(ctx)
	if err != nil {
		if errors.Is(err, airlock.ErrBoxNotFound) {
			pb.exited, pb.exitCode, pb.reason, pb.message, pb.finished = true, 137, ReasonBoxDied, "the box was removed", time.Now()
			if apiBox(pb.pod) && p.client != nil && !pb.deleted {
				// A box made through the API that its lifetime (ttl,
				// lease, idle_timeout) or a call on this node removed is
				// gone, as on airlock serve: its pod goes too.
				go p.deleteAPIPod(pb.pod)
			}
		}
		return
	}
	if info.State == airlock.BoxRunning {
		return
	}
	if info.Suspended && apiBox(pb.pod) {
		// Paused to disk (idle_action suspend, or a pause to disk through
		// the node's API): the box is kept and the next call resumes
		// it, so its pod runs on.
		return
	}
	pb.exited, pb.finished = true, time.Now()
	if e := info.Exit; e != nil {
		pb.exitCode, pb.finished = e.ExitCode, e.Finished
		switch e.Reason {
		case airlock.ExitExited:
			pb.reason = "Completed"
			if e.ExitCode != 0 {
				pb.reason = "Error"
			}
		case airlock.ExitOOMKilled:
			pb.reason = "OOMKilled"
		default:
			pb.reason, pb.message = ReasonBoxDied, strings.TrimSpace(string(e.Reason)+" "+e.Cause)
			if pb.exitCode == 0 {
				pb.exitCode = 137
			}
		}
		return
	}
	pb.exitCode, pb.reason, pb.message = 137, ReasonBoxDied, "the box stopped while the node was down"
}

// ReasonNodeRestarted is the terminated reason of a container whose
// command ended with the airlock node process that ran it (a command
// runs on that process's exec stream; a restarted node adopts the box,
// not the command).
const ReasonNodeRestarted = "NodeRestarted"

// resumeAdopted takes over each adopted pod that is not done: its
// container's command ended with the node process that ran it, so the
// container is terminated (ReasonNodeRestarted, exit 137; or the end the
// box recorded) and the pod's restartPolicy applies to it as to any end,
// with the restartCount and lastState the API showed (a restart is a new
// boot of the adopted box). Adopt calls it.
func (p *Provider) resumeAdopted() {
	p.mu.Lock()
	var todo []*podBox
	for _, pb := range p.pods {
		if pb.resume {
			pb.resume = false
			todo = append(todo, pb)
		}
	}
	p.mu.Unlock()
	for _, pb := range todo {
		ctx, cancel := context.WithCancel(context.Background())
		p.mu.Lock()
		pb.cancel = cancel
		p.mu.Unlock()
		go p.runAdopted(ctx, pb)
	}
}

// runAdopted records the end of an adopted pod's container and restarts
// it as its restartPolicy says (see resumeAdopted).
func (p *Provider) runAdopted(ctx context.Context, pb *podBox) {
	box := pb.box
	p.mu.Lock()
	if pb.deadline {
		p.mu.Unlock()
		return
	}
	p.refreshAdoptedLocked(pb) // a stopped box: the end it recorded
	pb.adopted = false
	if !pb.exited {
		pb.exited, pb.finished = true, time.Now()
		pb.exitCode, pb.reason = 137, ReasonNodeRestarted
		pb.message = "the container's command ended with the airlock node process that ran it"
	}
	code := pb.exitCode
	again := restarts(pb.pod.Spec.RestartPolicy, code)
	if again {
		pb.restarting = true
		pb.waiting, pb.message = "ContainerCreating", ""
		if pb.restartCount > 0 {
			// The back-off goes on from the restarts the API counted.
			pb.backoff = restartBackoff
			pb.waiting = "CrashLoopBackOff"
			pb.message = fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)",
				pb.backoff, pb.pod.Spec.Containers[0].Name, pb.pod.Name, pb.pod.Namespace, pb.pod.UID)
		}
	}
	p.mu.Unlock()
	p.logf("pod %s/%s: its container ended with the node (exit %d); restartPolicy %s", pb.pod.Namespace, pb.pod.Name, code, pb.pod.Spec.RestartPolicy)
	p.changed(pb)
	if !again {
		p.done(pb, box)
		return
	}
	pod, files, ok := pb.pod, []volumeFile(nil), true
	if p.client != nil {
		if pod, files, ok = p.resolvePodEnv(ctx, pb); !ok {
			return
		}
	}
	entry, cmd := box.ImageCommand()
	argv, err := command(&pod.Spec.Containers[0], entry, cmd)
	if err != nil {
		p.fail(pb, ReasonStartError, err.Error())
		return
	}
	p.publishPorts(pb, box)
	if p.client != nil && hasAPIVolumes(pod) {
		syncCtx, stopSync := context.WithCancel(ctx)
		defer stopSync()
		go p.syncVolumes(syncCtx, pb, box, files)
	}
	for p.restart(ctx, pb, box) {
		code, ok := p.runOnce(ctx, pb, box, argv)
		if !ok {
			return
		}
		if !restarts(pod.Spec.RestartPolicy, code) {
			p.done(pb, box)
			return
		}
	}
}

// reportTerminated tells the API that a pod deleted while its node was
// down has no container running any more (its box was removed), so that
// it is removed from the API at once (virtual-kubelet deletes a
// terminating pod that runs nothing), not after its grace period.
func (p *Provider) reportTerminated(ctx context.Context, pod *corev1.Pod) {
	if p.client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u := terminated(pod, "the pod was deleted while its node was down: its box was removed")
	if _, err := p.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		p.logf("pod %s/%s: reporting its end: %v", pod.Namespace, pod.Name, err)
	}
}

// Adopt takes over the boxes of a restarted node: each box named
// BoxName(uid) whose pod (one of pods, those bound to this node) still
// exists becomes that pod's again; every other box named with
// BoxNamePrefix is removed, so no VM outlives its pod. A pod that is done
// (Succeeded or Failed in the API) keeps the end its box recorded; one
// that is not is resumed (resumeAdopted): its command ended with the node
// that ran it, and its restartPolicy applies, with the API's restartCount.
// Call SetAPI first: a resumed pod's env and volumes are made again.
func (p *Provider) Adopt(ctx context.Context, pods []corev1.Pod) error {
	byUID := map[types.UID]*corev1.Pod{}
	for i := range pods {
		byUID[pods[i].UID] = &pods[i]
	}
	boxes, err := p.rt.List(ctx)
	if err != nil {
		return err
	}
	for _, info := range boxes {
		uid, ok := strings.CutPrefix(info.Name, BoxNamePrefix)
		if !ok {
			continue
		}
		pod, ok := byUID[types.UID(uid)]
		if !ok || pod.DeletionTimestamp != nil {
			if err := p.rt.Remove(ctx, info.ID, true); err != nil && !errors.Is(err, airlock.ErrBoxNotFound) {
				return fmt.Errorf("removing box %s of a pod that is gone: %w", info.Name, err)
			}
			p.logf("removed box %s: its pod is gone", info.Name)
			if ok {
				p.reportTerminated(ctx, pod)
			}
			continue
		}
		box, err := p.rt.Get(ctx, info.ID)
		if err != nil {
			return err
		}
		pb := &podBox{pod: pod.DeepCopy(), box: box, adopted: true, started: info.Started, startedCh: make(chan struct{}),
			startTime: info.Created, activeDeadline: pod.Spec.ActiveDeadlineSeconds}
		close(pb.startedCh)
		if t := pod.Status.StartTime; t != nil {
			pb.startTime = t.Time
		}
		if info.ImageDigest != "" {
			pb.imageID = repository(info.Image) + "@" + info.ImageDigest
		}
		if pb.started.IsZero() {
			pb.started = info.Created
		}
		// The API's counts go on; a pod that is not done is resumed
		// (resumeAdopted): its command did not outlive the node.
		if n := len(pod.Status.ContainerStatuses); n > 0 {
			cs := pod.Status.ContainerStatuses[0]
			pb.restartCount = int(cs.RestartCount)
			if t := cs.LastTerminationState.Terminated; t != nil {
				pb.last = t.DeepCopy()
			}
		}
		// A box made through the API runs no command, so nothing ended
		// with the node: it runs on as adopted.
		pb.resume = !apiBox(pod) && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
		done := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
		p.mu.Lock()
		p.pods[key(pod.Namespace, pod.Name)] = pb
		if !done {
			p.armDeadlineLocked(pb)
		}
		p.mu.Unlock()
		p.logf("adopted box %s of pod %s/%s", info.Name, pod.Namespace, pod.Name)
	}
	p.resumeAdopted()
	return nil
}
