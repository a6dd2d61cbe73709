package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/airlock-run/airlock/internal/kubebox"
	"github.com/airlock-run/airlock/internal/server"
)

// Memory snapshots stay on the node that took them (its airlock home):
// the gateway finds them by asking every node's API (no state of its
// own), binds a restore's pod to the node that holds its snapshot (node
// affinity: the scheduler still counts its resources, and its refusal is
// the create's answer), and forks a box by a snapshot on its node and
// children restored from it there.

var _ server.ClusterSnapshots = (*Gateway)(nil)

// maxNodeListBytes bounds a node's answer to GET /v1/snapshots.
const maxNodeListBytes = 8 << 20

// forkSnapshotPrefix names the snapshot a fork takes on the parent's
// node (removed once the children run).
const forkSnapshotPrefix = "airlock-fork-"

// nodeCall makes an API call to node st with the node token and decodes
// a 2xx answer into out (when not nil). A problem the node answers is
// returned as it is (a 401 as the gateway's bad node token); an error that
// is not a *server.Problem is the node's not answering.
func (g *Gateway) nodeCall(ctx context.Context, st nodeState, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, st.api+path, rd)
	if err != nil {
		return &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
			Detail: fmt.Sprintf("node %s advertises a bad API address %q (annotation %s): %v", st.name, st.api, kubebox.APIAnnotation, err)}
	}
	req.Header.Set("Authorization", "Bearer "+g.cfg.NodeToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	g.markReachable(st.name)
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxNodeListBytes))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var pr server.Problem
		if json.Unmarshal(data, &pr) == nil && pr.Code != "" {
			if pr.Code == server.CodeUnauthorized {
				pr.Status, pr.Detail = http.StatusBadGateway, fmt.Sprintf("node %s refused the gateway's node token: give the gateway the nodes' token (airlock gateway --node-token-file, airlock node --api-token-file)", st.name)
			}
			if pr.Status == 0 {
				pr.Status = resp.StatusCode
			}
			return &pr
		}
		return &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
			Detail: fmt.Sprintf("node %s answered %s %s: %s", st.name, method, path, resp.Status)}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
				Detail: fmt.Sprintf("node %s: %s %s: %v", st.name, method, path, err)}
		}
	}
	return nil
}

// apiNodes are the states of the nodes that advertise an airlock API,
// by name.
func (g *Gateway) apiNodes(ctx context.Context) ([]nodeState, error) {
	nodes, err := g.nodes.List(labels.Everything())
	if err != nil {
		return nil, apiProblem(err)
	}
	var out []nodeState
	for _, n := range nodes {
		if n.Annotations[kubebox.APIAnnotation] == "" {
			continue
		}
		st, err := g.node(ctx, n.Name, false)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b nodeState) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// eachNode calls f on every node that serves an airlock API and is not
// lost, at once (each call bounded to 30 s); it returns the names of the
// nodes that could not be asked, and why.
func (g *Gateway) eachNode(ctx context.Context, f func(context.Context, nodeState) error) ([]string, error) {
	nodes, err := g.apiNodes(ctx)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var missed []string
	var wg sync.WaitGroup
	for _, st := range nodes {
		if st.lost != "" {
			missed = append(missed, st.lost)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := f(cctx, st); err != nil {
				if !errors.As(err, new(*server.Problem)) {
					g.markUnreachable(st.name, err)
					err = fmt.Errorf("node %s does not answer (%v)", st.name, err)
				}
				mu.Lock()
				missed = append(missed, err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(missed)
	return missed, nil
}

// fixSnapshot makes a node's snapshot the gateway's: its box's id, name
// and labels from the labels the node's box carried (its pod's), and its
// node.
func fixSnapshot(sn server.Snapshot, node string) server.Snapshot {
	l := sn.Labels
	sn.Node, sn.Labels, sn.BoxName = node, nil, ""
	if id := l[kubebox.IDLabel]; id != "" {
		sn.Box = id
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: l}}
	sn.BoxName, sn.Labels = boxName(p), boxLabels(p)
	return sn
}

// Snapshots implements server.ClusterSnapshots: every node's snapshots
// (those of the nodes that answer), oldest first. The snapshots a fork
// takes for the while of its children's start are left out.
func (g *Gateway) Snapshots(ctx context.Context) ([]server.Snapshot, error) {
	var mu sync.Mutex
	var out []server.Snapshot
	missed, err := g.eachNode(ctx, func(ctx context.Context, st nodeState) error {
		var list server.SnapshotList
		if err := g.nodeCall(ctx, st, http.MethodGet, "/v1/snapshots", nil, &list); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, sn := range list.Snapshots {
			if !strings.HasPrefix(sn.Name, forkSnapshotPrefix) {
				out = append(out, fixSnapshot(sn, st.name))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, m := range missed {
		g.cfg.Logf("snapshots: %s", m)
	}
	slices.SortFunc(out, func(a, b server.Snapshot) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// findSnapshot returns the snapshot named name and the node that holds
// it; none is 404 snapshot_not_found, naming the nodes that could not be
// asked.
func (g *Gateway) findSnapshot(ctx context.Context, name string) (server.Snapshot, nodeState, error) {
	var mu sync.Mutex
	var found server.Snapshot
	var where nodeState
	missed, err := g.eachNode(ctx, func(ctx context.Context, st nodeState) error {
		var sn server.Snapshot
		err := g.nodeCall(ctx, st, http.MethodGet, "/v1/snapshots/"+url.PathEscape(name), nil, &sn)
		var p *server.Problem
		if errors.As(err, &p) && p.Code == server.CodeSnapshotNotFound {
			return nil
		}
		if err != nil {
			return err
		}
		mu.Lock()
		found, where = fixSnapshot(sn, st.name), st
		mu.Unlock()
		return nil
	})
	if err != nil {
		return found, where, err
	}
	if where.name == "" {
		detail := fmt.Sprintf("no snapshot %q on the cluster's airlock nodes", name)
		if len(missed) > 0 {
			detail += " that answer (" + strings.Join(missed, "; ") + "): it may be on one of those"
		}
		return found, where, &server.Problem{Status: http.StatusNotFound, Code: server.CodeSnapshotNotFound, Detail: detail}
	}
	return found, where, nil
}

// Snapshot implements server.ClusterSnapshots.
func (g *Gateway) Snapshot(ctx context.Context, name string) (server.Snapshot, error) {
	sn, _, err := g.findSnapshot(ctx, name)
	return sn, err
}

// RemoveSnapshot implements server.ClusterSnapshots: on the node that
// holds it (boxes restored from it keep running).
func (g *Gateway) RemoveSnapshot(ctx context.Context, name string) error {
	_, st, err := g.findSnapshot(ctx, name)
	if err != nil {
		return err
	}
	return g.nodeError(st, g.nodeCall(ctx, st, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(name), nil, nil))
}

// nodeError is err of a call to node st as the client sees it: a problem
// as it is, a failure to answer as the node's not answering.
func (g *Gateway) nodeError(st nodeState, err error) error {
	if err == nil || errors.As(err, new(*server.Problem)) {
		return err
	}
	g.markUnreachable(st.name, err)
	return &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
		Detail: fmt.Sprintf("node %s does not answer (%v): try again", st.name, err)}
}

// runningBox returns the pod of the box id names and its node, for a
// call that needs the box running there.
func (g *Gateway) runningBox(ctx context.Context, id string) (*corev1.Pod, nodeState, error) {
	p, err := g.findPod(ctx, id)
	if err != nil {
		return nil, nodeState{}, err
	}
	if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning {
		return nil, nodeState{}, &server.Problem{Status: http.StatusConflict, Code: server.CodeBoxNotRunning,
			Detail: fmt.Sprintf("box %s is not running (%s)", id, podWhy(p))}
	}
	st, err := g.node(ctx, p.Spec.NodeName, false)
	if err != nil {
		return nil, st, err
	}
	if st.lost != "" {
		return nil, st, lostProblem(id, st.lost)
	}
	return p, st, nil
}

// SnapshotBox implements server.ClusterSnapshots: the box's node takes
// the snapshot, which stays there. Names are unique across the cluster.
func (g *Gateway) SnapshotBox(ctx context.Context, id, name string) (server.Snapshot, error) {
	if strings.HasPrefix(name, forkSnapshotPrefix) || strings.Contains(name, "."+forkSnapshotPrefix) {
		return server.Snapshot{}, invalid("snapshot names starting %q are airlock gateway's own (a fork's): pick another", forkSnapshotPrefix)
	}
	p, st, err := g.runningBox(ctx, id)
	if err != nil {
		return server.Snapshot{}, err
	}
	if sn, _, err := g.findSnapshot(ctx, name); err == nil {
		return server.Snapshot{}, &server.Problem{Status: http.StatusConflict, Code: server.CodeSnapshotExists,
			Detail: fmt.Sprintf("a snapshot named %q exists (on node %s): pick another name, or remove it (DELETE /v1/snapshots/{name})", name, sn.Node)}
	}
	var sn server.Snapshot
	err = g.nodeCall(ctx, st, http.MethodPost, "/v1/boxes/"+kubebox.BoxName(string(p.UID))+"/snapshot", server.SnapshotRequest{Name: name}, &sn)
	if err != nil {
		return sn, g.nodeError(st, err)
	}
	return fixSnapshot(sn, st.name), nil
}

// fromSnapshot makes pod a restore of sp.FromSnapshot: the snapshot's
// image and size, bound to the node that holds it. What a restore cannot
// change (its network, volumes) is refused here, before any pod.
func (g *Gateway) fromSnapshot(ctx context.Context, pod *corev1.Pod, sp server.BoxSpec) error {
	sn, st, err := g.findSnapshot(ctx, sp.FromSnapshot)
	if err != nil {
		return err
	}
	switch {
	case len(sp.Volumes) > 0:
		return invalid("from_snapshot: a restore takes no volumes (the snapshot's box had none)")
	case sp.Image != "" && sp.Image != sn.Image:
		return invalid("from_snapshot: image %q is not the snapshot's (%s): leave it out", sp.Image, sn.Image)
	case sp.CPUs != 0 && sp.CPUs != sn.CPUs, sp.MemoryMiB != 0 && sp.MemoryMiB != sn.MemoryMiB:
		return invalid("from_snapshot: a restore has the snapshot's %d vCPUs and %d MiB of memory: leave cpus and memory_mib out", sn.CPUs, sn.MemoryMiB)
	case sp.Network != "" && sp.Network != sn.Network, len(sp.AllowNet) > 0 && sn.Network != "allowlist":
		return invalid("from_snapshot: a restore keeps the snapshot's network (%s): leave network and allow_net out", sn.Network)
	}
	c := &pod.Spec.Containers[0]
	c.Image = sn.Image
	res := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(max(sn.CPUs, 1)), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(max(sn.MemoryMiB, 1))<<20, resource.BinarySI),
	}
	c.Resources = corev1.ResourceRequirements{Limits: res, Requests: res}
	o, err := kubebox.ParseOptions(pod.Annotations[kubebox.OptionsAnnotation])
	if err != nil {
		return err
	}
	o.Network, o.DiskSizeMiB = sn.Network, sn.DiskSizeMiB
	pod.Annotations[kubebox.OptionsAnnotation] = o.Format()
	pinned(pod, st.name)
	return nil
}

// ForkBox implements server.ClusterSnapshots: the parent's node takes a
// snapshot of it, n pods restoring it are made, bound to that node, and
// the snapshot is removed once they run (or fail). The children have the
// parent's labels, image, size, env, network, lease and idle timeout, and
// what is left of its TTL; no name, ports, volumes or secrets.
func (g *Gateway) ForkBox(ctx context.Context, id string, n int, fromCheckpoint string, admit func([]server.Box) error) ([]server.Box, error) {
	if fromCheckpoint != "" {
		return nil, &server.Problem{Status: http.StatusNotImplemented, Code: server.CodeNotSupported,
			Detail: "a fork from a checkpoint is not served by airlock gateway: its children would have to start from a memory snapshot of the checkpoint, which a node cannot take. Roll the box back (POST /v1/boxes/{id}/rollback), then fork it, or fork it on its node's airlock serve"}
	}
	p, st, err := g.runningBox(ctx, id)
	if err != nil {
		return nil, err
	}
	snap := forkSnapshotPrefix + newID()
	var sn server.Snapshot
	if err := g.nodeCall(ctx, st, http.MethodPost, "/v1/boxes/"+kubebox.BoxName(string(p.UID))+"/snapshot", server.SnapshotRequest{Name: snap}, &sn); err != nil {
		return nil, g.nodeError(st, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := g.nodeCall(dctx, st, http.MethodDelete, "/v1/snapshots/"+snap, nil, nil); err != nil {
			g.cfg.Logf("fork of %s: the snapshot %s on node %s was not removed: %v", id, snap, st.name, err)
		}
	}()
	o, err := kubebox.ParseOptions(p.Annotations[kubebox.OptionsAnnotation])
	if err != nil {
		return nil, err
	}
	if o.TTL > 0 {
		o.TTL = max(o.TTL-time.Since(p.CreationTimestamp.Time).Seconds(), 1)
	}
	o.Ports, o.Volumes, o.Secrets, o.SecretsFrom, o.FromSnapshot = nil, nil, nil, "", snap
	o.Network, o.DiskSizeMiB = sn.Network, sn.DiskSizeMiB
	type result struct {
		box server.Box
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		kidID := newID()
		lbl := map[string]string{kubebox.IDLabel: kidID}
		for k, v := range p.Labels {
			if k != kubebox.IDLabel && k != kubebox.NameLabel {
				lbl[k] = v
			}
		}
		// The parent's container as the gateway made it (not the fields
		// the API server filled in, such as priority, which a create
		// may not set).
		c := p.Spec.Containers[0]
		rc, no, grace := kubebox.RuntimeClass, false, int64(deleteGrace)
		kid := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: kubebox.PodNamePrefix + kidID, Namespace: g.cfg.Namespace, Labels: lbl,
				Annotations: map[string]string{kubebox.OptionsAnnotation: o.Format()}},
			Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no,
				TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{Name: c.Name, Image: c.Image, WorkingDir: c.WorkingDir,
					ImagePullPolicy: c.ImagePullPolicy, Env: c.Env, Resources: c.Resources, SecurityContext: c.SecurityContext}}},
		}
		pinned(kid, st.name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := g.launch(ctx, kid, server.BoxSpec{}, admit)
			results[i] = result{b, err}
		}()
	}
	wg.Wait()
	var kids []server.Box
	var firstErr error
	for _, r := range results {
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
		if r.err == nil {
			kids = append(kids, r.box)
		}
	}
	if firstErr != nil {
		// No child is left.
		for _, k := range kids {
			if err := g.RemoveBox(context.WithoutCancel(ctx), k.ID, true); err != nil {
				g.cfg.Logf("fork of %s failed: child %s not removed: %v", id, k.ID, err)
			}
		}
		return nil, firstErr
	}
	g.cfg.Logf("box %s forked into %d on node %s", id, n, st.name)
	return kids, nil
}
