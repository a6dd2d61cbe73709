package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/airlock-run/airlock/internal/kubebox"
	"github.com/airlock-run/airlock/internal/server"
)

// Box sizes a pod asks for when the create leaves them out: airlock's
// defaults, so that the scheduler counts what the box takes.
const (
	defaultCPUs      = 1
	defaultMemoryMiB = 512
)

func invalid(format string, args ...any) *server.Problem {
	return &server.Problem{Status: http.StatusBadRequest, Code: server.CodeInvalid, Detail: fmt.Sprintf(format, args...)}
}

// podOf is the pod of a box made from spec, with id.
func (g *Gateway) podOf(id string, sp server.BoxSpec) (*corev1.Pod, error) {
	lbl := map[string]string{kubebox.IDLabel: id}
	tenant := sp.Labels[server.TenantLabel] // set by the server, for a tenant's create
	if tenant != "" {
		if errs := validation.IsValidLabelValue(tenant); len(errs) > 0 {
			return nil, invalid("tenant %q is not a valid Kubernetes label value: %s", tenant, strings.Join(errs, "; "))
		}
		lbl[kubebox.TenantLabel] = tenant
		sp.Name = strings.TrimPrefix(sp.Name, tenant+".") // its name space is the label's
	}
	for k, v := range sp.Labels {
		if k == server.TenantLabel {
			continue
		}
		if strings.HasPrefix(k, "airlock.dev/") {
			return nil, invalid("label %q: the airlock.dev/ prefix is airlock's own: use another key", k)
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, invalid("label key %q is not a valid Kubernetes label key (a box's labels are its pod's labels): %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, invalid("label %s: value %q is not a valid Kubernetes label value (a box's labels are its pod's labels): %s", k, v, strings.Join(errs, "; "))
		}
		lbl[k] = v
	}
	if sp.Name != "" {
		if errs := validation.IsValidLabelValue(sp.Name); len(errs) > 0 {
			return nil, invalid("name %q: a box's name through airlock gateway is a Kubernetes label value: %s", sp.Name, strings.Join(errs, "; "))
		}
		lbl[kubebox.NameLabel] = sp.Name
	}
	cpus, mem := sp.CPUs, sp.MemoryMiB
	if cpus == 0 {
		cpus = defaultCPUs
	}
	if mem == 0 {
		mem = defaultMemoryMiB
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(cpus), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(mem)<<20, resource.BinarySI),
	}
	// The image as airlock serve finds it: the node's stored one, pulled
	// when absent (the API server's default would pull untagged names
	// at every create).
	c := corev1.Container{Name: "box", Image: sp.Image, WorkingDir: sp.WorkingDir, ImagePullPolicy: corev1.PullIfNotPresent,
		Resources: corev1.ResourceRequirements{Limits: res, Requests: res}}
	for _, e := range sp.Env {
		k, v, _ := strings.Cut(e, "=")
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: v})
	}
	opts := kubebox.Options{Network: sp.Network, AllowNet: sp.AllowNet, DiskSizeMiB: sp.DiskSizeMiB, User: sp.User,
		TTL: sp.TTL, IdleTimeout: sp.IdleTimeout, Lease: sp.Lease, IdleAction: sp.IdleAction, AutoRemove: sp.AutoRemove,
		AllowHostPorts: sp.AllowHostPorts, FromSnapshot: sp.FromSnapshot}
	for _, pm := range sp.Ports {
		opts.Ports = append(opts.Ports, kubebox.Port{HostIP: pm.HostIP, HostPort: pm.HostPort, GuestPort: pm.GuestPort, Protocol: pm.Protocol})
	}
	for _, v := range sp.Volumes {
		opts.Volumes = append(opts.Volumes, kubebox.Volume{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	if len(sp.Secrets) > 0 {
		// The values go into a Secret of the pod's name (secretOf), never
		// into the pod.
		opts.Secrets, opts.SecretsFrom = map[string]kubebox.SecretHosts{}, kubebox.PodNamePrefix+id
		for n, sec := range sp.Secrets {
			opts.Secrets[n] = kubebox.SecretHosts{Hosts: sec.Hosts}
		}
	}
	if a := opts.Format(); len(a) > kubebox.MaxOptionsBytes {
		return nil, invalid("the box's options take %d bytes, more than a pod's annotation may (%d): fewer allow_net, ports, volumes or secrets", len(a), kubebox.MaxOptionsBytes)
	}
	rc, no, grace := kubebox.RuntimeClass, false, int64(deleteGrace)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: kubebox.PodNamePrefix + id, Namespace: g.cfg.Namespace, Labels: lbl,
			Annotations: map[string]string{kubebox.OptionsAnnotation: opts.Format()}},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &no, TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{c}},
	}
	return pod, nil
}

// pinned binds pod to node by node affinity (the node that holds the
// snapshot it restores, or its parent's): the scheduler still counts its
// resources, and its refusal names why.
func pinned(pod *corev1.Pod, node string) {
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}}
}

// pinnedTo is the node pinned made pod run on, or "".
func pinnedTo(pod *corev1.Pod) string {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

// secretOf is the Secret that holds the values of a create's secrets for
// its pod (kubebox.Options.SecretsFrom), owned by the pod so that it goes
// with it.
func secretOf(pod *corev1.Pod, sp server.BoxSpec) *corev1.Secret {
	if len(sp.Secrets) == 0 {
		return nil
	}
	data := make(map[string][]byte, len(sp.Secrets))
	for n, sec := range sp.Secrets {
		data[n] = []byte(sec.Value)
	}
	yes := true
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: map[string]string{kubebox.IDLabel: pod.Labels[kubebox.IDLabel]},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: &yes}}},
		Type: corev1.SecretTypeOpaque, Data: data,
	}
}

// userLabels are the pod's labels that are the box's (not airlock's own).
func userLabels(p *corev1.Pod) map[string]string {
	var out map[string]string
	for k, v := range p.Labels {
		if strings.HasPrefix(k, "airlock.dev/") {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}

// boxLabels are the box's labels: the pod's user labels, and the
// server's TenantLabel for a tenant's box.
func boxLabels(p *corev1.Pod) map[string]string {
	l := userLabels(p)
	if t := p.Labels[kubebox.TenantLabel]; t != "" {
		if l == nil {
			l = map[string]string{}
		}
		l[server.TenantLabel] = t
	}
	return l
}

// boxName is the box's name as the server stores it: TENANT.NAME for a
// tenant's box (the server shows the tenant NAME), the name label else.
func boxName(p *corev1.Pod) string {
	n, t := p.Labels[kubebox.NameLabel], p.Labels[kubebox.TenantLabel]
	if n != "" && t != "" {
		return t + "." + n
	}
	return n
}

// boxOfPod is the box as its pod shows it (no call to its node); ns is
// its node's state (nil: none yet).
func boxOfPod(p *corev1.Pod, ns *nodeState) server.Box {
	b := server.Box{ID: p.Labels[kubebox.IDLabel], Name: boxName(p), Created: p.CreationTimestamp.Time,
		Labels: boxLabels(p), Node: p.Spec.NodeName, Network: "public"}
	if len(p.Spec.Containers) > 0 {
		c := p.Spec.Containers[0]
		b.Image = c.Image
		if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
			b.CPUs = int((q.MilliValue() + 999) / 1000)
		}
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			b.MemoryMiB = int(q.Value() >> 20)
		}
	}
	if o, err := kubebox.ParseOptions(p.Annotations[kubebox.OptionsAnnotation]); err == nil {
		b.DiskSizeMiB, b.AllowNet, b.AutoRemove = o.DiskSizeMiB, o.AllowNet, o.AutoRemove
		if o.Network != "" {
			b.Network = o.Network
		}
	}
	switch p.Status.Phase {
	case corev1.PodRunning:
		b.State = "running"
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running != nil {
				b.Started = cs.State.Running.StartedAt.Time
			}
		}
	case corev1.PodSucceeded, corev1.PodFailed:
		b.State = "stopped"
	default:
		b.State = "created"
	}
	if ns != nil && ns.lost != "" && b.State != "stopped" {
		b.State = server.BoxLost
	}
	return b
}

// fixBox puts the pod's id, name, labels and node on a box its node
// returned (the node knows the box by kubebox.BoxName(pod UID)).
func fixBox(b *server.Box, p *corev1.Pod) {
	b.ID, b.Name, b.Labels, b.Node = p.Labels[kubebox.IDLabel], boxName(p), boxLabels(p), p.Spec.NodeName
	if o, err := kubebox.ParseOptions(p.Annotations[kubebox.OptionsAnnotation]); err == nil {
		b.AutoRemove = o.AutoRemove
	}
}

// nodeBox asks the node for the pod's box. Errors that are not problems
// are the node's failing to answer.
func (g *Gateway) nodeBox(ctx context.Context, st nodeState, p *corev1.Pod) (server.Box, error) {
	var b server.Box
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.api+"/v1/boxes/"+kubebox.BoxName(string(p.UID)), nil)
	if err != nil {
		return b, &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
			Detail: fmt.Sprintf("node %s advertises a bad API address %q (annotation %s): %v", st.name, st.api, kubebox.APIAnnotation, err)}
	}
	req.Header.Set("Authorization", "Bearer "+g.cfg.NodeToken)
	resp, err := g.client.Do(req)
	if err != nil {
		return b, err
	}
	defer resp.Body.Close()
	g.markReachable(st.name)
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxNodeBoxBytes))
	if err != nil {
		return b, err
	}
	if resp.StatusCode != http.StatusOK {
		var pr server.Problem
		if json.Unmarshal(body, &pr) == nil && pr.Code != "" {
			if pr.Code == server.CodeUnauthorized {
				pr.Status, pr.Detail = http.StatusBadGateway, fmt.Sprintf("node %s refused the gateway's node token: give the gateway the nodes' token (airlock gateway --node-token-file, airlock node --api-token-file)", st.name)
			}
			return b, &pr
		}
		return b, &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
			Detail: fmt.Sprintf("node %s answered %s", st.name, resp.Status)}
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return b, &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
			Detail: fmt.Sprintf("node %s: box: %v", st.name, err)}
	}
	fixBox(&b, p)
	return b, nil
}

// CreateBox implements server.Cluster: it creates the box's pod and
// returns once the pod runs on a node, with the box as that node shows
// it. The scheduler's refusal (Unschedulable) is 409 unschedulable with
// its message; a pod its node fails is the node's reason. A create that
// fails deletes its pod. A tenant's pod (the spec's server.TenantLabel)
// carries kubebox.TenantLabel; admit, when set, is given the tenant's
// pods as the API server lists them once the new one exists.
func (g *Gateway) CreateBox(ctx context.Context, sp server.BoxSpec, admit func([]server.Box) error) (server.Box, error) {
	id := newID()
	pod, err := g.podOf(id, sp)
	if err != nil {
		return server.Box{}, err
	}
	tenant := pod.Labels[kubebox.TenantLabel]
	if name := pod.Labels[kubebox.NameLabel]; name != "" {
		set := labels.Set{kubebox.NameLabel: name}
		if tenant != "" {
			set[kubebox.TenantLabel] = tenant
		}
		list, err := g.cfg.Client.CoreV1().Pods(g.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: set.String()})
		if err != nil {
			return server.Box{}, apiProblem(err)
		}
		list.Items = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.Labels[kubebox.TenantLabel] != tenant })
		if len(list.Items) > 0 {
			return server.Box{}, &server.Problem{Status: http.StatusConflict, Code: server.CodeNameInUse,
				Detail: fmt.Sprintf("a box named %q exists (%s): pick another name, or remove it", sp.Name, list.Items[0].Labels[kubebox.IDLabel])}
		}
	}
	if sp.FromSnapshot != "" {
		if err := g.fromSnapshot(ctx, pod, sp); err != nil {
			return server.Box{}, err
		}
	}
	return g.launch(ctx, pod, sp, admit)
}

// launch creates pod (and the Secret of sp's secrets) and returns once it
// runs on a node, with the box as that node shows it (CreateBox).
func (g *Gateway) launch(ctx context.Context, pod *corev1.Pod, sp server.BoxSpec, admit func([]server.Box) error) (server.Box, error) {
	id, tenant := pod.Labels[kubebox.IDLabel], pod.Labels[kubebox.TenantLabel]
	pods := g.cfg.Client.CoreV1().Pods(g.cfg.Namespace)
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
			return server.Box{}, invalid("the box's pod was refused: %v", err)
		}
		return server.Box{}, apiProblem(err)
	}
	fail := func(p *server.Problem) (server.Box, error) {
		zero := int64(0)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		pods.Delete(dctx, created.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &created.UID}})
		return server.Box{}, p
	}
	if sec := secretOf(created, sp); sec != nil {
		if _, err := g.cfg.Client.CoreV1().Secrets(g.cfg.Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			return fail(&server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
				Detail: fmt.Sprintf("the Secret of the box's secrets could not be made (may the gateway create secrets? deploy/kubernetes/gateway-rbac.yaml): %v", err)})
		}
	}
	if admit != nil {
		// From the API server, not the cache: a pod another gateway made
		// a moment ago counts.
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: labels.Set{kubebox.TenantLabel: tenant}.String()})
		if err != nil {
			return fail(apiProblem(err))
		}
		var boxes []server.Box
		for i := range list.Items {
			if p := &list.Items[i]; p.DeletionTimestamp == nil {
				boxes = append(boxes, boxOfPod(p, nil))
			}
		}
		if err := admit(boxes); err != nil {
			var p *server.Problem
			if !errors.As(err, &p) {
				p = &server.Problem{Status: http.StatusForbidden, Code: server.CodeQuotaExceeded, Detail: err.Error()}
			}
			return fail(p)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, g.cfg.CreateTimeout)
	defer cancel()
	for tick := 0; ; tick++ {
		p, err := g.pods.Get(created.Name)
		if err != nil || p.UID != created.UID || tick%20 == 19 {
			// Not in the cache yet, or now and then: from the API server.
			if q, err := pods.Get(wctx, created.Name, metav1.GetOptions{}); err == nil {
				p = q
			}
		}
		if p != nil && p.UID == created.UID {
			if b, done, perr := g.created(wctx, p); done {
				if perr != nil {
					return fail(perr)
				}
				g.cfg.Logf("box %s made: pod %s on node %s", id, p.Name, p.Spec.NodeName)
				return b, nil
			}
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return fail(&server.Problem{Status: 499, Code: server.CodeCanceled, Detail: "the client went away: the box's pod was deleted"})
			}
			why := "pending"
			if p != nil {
				why = podWhy(p)
			}
			return fail(&server.Problem{Status: http.StatusGatewayTimeout, Code: server.CodeTimeout,
				Detail: fmt.Sprintf("the box's pod did not run within %s (%s): it was deleted", g.cfg.CreateTimeout, why)})
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// created looks at a new box's pod: done with the box once it runs and
// its node shows it, done with a problem when it cannot run.
func (g *Gateway) created(ctx context.Context, p *corev1.Pod) (server.Box, bool, *server.Problem) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			detail := fmt.Sprintf("no node can run the box: %s (the Kubernetes scheduler)", c.Message)
			if n := pinnedTo(p); n != "" {
				detail += fmt.Sprintf(". The box must run on node %s, which holds the memory snapshot it starts from (a restore, or a fork's child): free room there (remove or stop boxes on it), or create the box afresh from its image", n)
			}
			return server.Box{}, true, &server.Problem{Status: http.StatusConflict, Code: server.CodeUnschedulable, Detail: detail}
		}
	}
	switch p.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		why := podWhy(p)
		if strings.Contains(why, kubebox.ReasonPolicyDenied) {
			return server.Box{}, true, &server.Problem{Status: http.StatusForbidden, Code: server.CodePolicyDenied,
				Detail: fmt.Sprintf("node %s refused the box: %s", p.Spec.NodeName, why)}
		}
		if strings.Contains(why, "ErrImagePull") {
			return server.Box{}, true, &server.Problem{Status: http.StatusNotFound, Code: server.CodeImageNotFound,
				Detail: fmt.Sprintf("node %s could not get the image: %s", p.Spec.NodeName, why)}
		}
		return server.Box{}, true, &server.Problem{Status: http.StatusBadGateway, Code: server.CodeBoxDied,
			Detail: fmt.Sprintf("node %s could not run the box: %s", p.Spec.NodeName, why)}
	case corev1.PodRunning:
	default:
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason == "ErrImagePull" {
				return server.Box{}, true, &server.Problem{Status: http.StatusNotFound, Code: server.CodeImageNotFound,
					Detail: fmt.Sprintf("node %s could not get the image: %s", p.Spec.NodeName, w.Message)}
			}
		}
		return server.Box{}, false, nil
	}
	st, err := g.node(ctx, p.Spec.NodeName, false)
	if err != nil {
		return server.Box{}, false, nil
	}
	if st.lost != "" {
		return server.Box{}, true, lostProblem(p.Labels[kubebox.IDLabel], st.lost)
	}
	if st.api == "" {
		return server.Box{}, true, &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
			Detail: fmt.Sprintf("node %s serves no airlock API (no annotation %s: start it with airlock node --api-listen)", st.name, kubebox.APIAnnotation)}
	}
	b, err := g.nodeBox(ctx, st, p)
	if err != nil {
		return server.Box{}, false, nil // tried again until the deadline
	}
	return b, true, nil
}

// podWhy says where a pod stands: its phase, reason and message, or its
// container's.
func podWhy(p *corev1.Pod) string {
	parts := []string{"pod " + string(p.Status.Phase)}
	if p.Status.Reason != "" {
		parts = append(parts, p.Status.Reason)
	}
	if p.Status.Message != "" {
		parts = append(parts, p.Status.Message)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			parts = append(parts, w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil {
			parts = append(parts, t.Reason, t.Message)
		}
	}
	return strings.Join(slicesCompact(parts), ": ")
}

func slicesCompact(s []string) []string {
	out := s[:0]
	for _, x := range s {
		if x != "" {
			out = append(out, x)
		}
	}
	return out
}
