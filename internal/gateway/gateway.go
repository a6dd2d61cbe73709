// Package gateway is airlock gateway: airlock's REST API (the OpenAPI of
// airlock serve, served by internal/server with a Cluster) over the
// airlock nodes of a Kubernetes cluster. A box is a pod with
// runtimeClassName airlock, made and deleted through the API server; every
// call into a box is proxied to the airlock API of the node that runs it
// (kubenode, airlock node --api-listen), found from the pod's
// spec.nodeName and the Node's annotation kubebox.APIAnnotation. The
// gateway keeps no state of its own: pods and nodes are read through
// client-go informers (a live GET on a miss), so any number of gateways
// answer for the same boxes and a restarted one loses nothing.
package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/airlock-run/airlock/internal/kubebox"
	"github.com/airlock-run/airlock/internal/server"
)

// Defaults for Config fields left zero.
const (
	DefaultNamespace     = "default"
	DefaultCreateTimeout = 5 * time.Minute
	DefaultRemoveTimeout = 2 * time.Minute
	// DefaultDialTimeout bounds a connection to a node's API.
	DefaultDialTimeout = 5 * time.Second
	// unreachableFor is how long a node that did not answer is reported
	// lost in lists without being tried again.
	unreachableFor = 30 * time.Second
	// deleteGrace is the grace period (seconds) of a box's pod.
	deleteGrace = 1
	// maxNodeBoxBytes bounds a node's answer to GET /v1/boxes/{id}.
	maxNodeBoxBytes = 1 << 20
)

// Config configures a Gateway.
type Config struct {
	// Client talks to the cluster (required).
	Client kubernetes.Interface
	// Namespace holds the boxes' pods (default "default").
	Namespace string
	// NodeToken is the bearer token of the nodes' airlock API (airlock
	// node --api-token-file); required. Users' tokens never reach a node.
	NodeToken string
	// CreateTimeout bounds a create: from the pod's creation to its box
	// running on a node (default 5 min); past it the pod is deleted and
	// the client gets 504 timeout.
	CreateTimeout time.Duration
	// RemoveTimeout bounds the wait for a deleted pod to be gone
	// (default 2 min).
	RemoveTimeout time.Duration
	// Logf, when set, gets a line per box made, removed or lost.
	Logf func(format string, args ...any)
}

// Gateway serves a cluster's boxes; it implements server.Cluster.
type Gateway struct {
	cfg       Config
	pods      corelisters.PodNamespaceLister
	nodes     corelisters.NodeLister
	leases    coordlisters.LeaseNamespaceLister
	factories []informers.SharedInformerFactory
	synced    []cache.InformerSynced
	transport *http.Transport
	client    *http.Client // node calls of the gateway's own (GET a box)

	mu          sync.Mutex
	unreachable map[string]unreachable // by node name
}

type unreachable struct {
	at  time.Time
	err string
}

var _ server.Cluster = (*Gateway)(nil)

// New returns a Gateway for cfg; Start starts its informers.
func New(cfg Config) (*Gateway, error) {
	if cfg.Client == nil || cfg.NodeToken == "" {
		return nil, errors.New("gateway: Client and NodeToken are required")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.CreateTimeout <= 0 {
		cfg.CreateTimeout = DefaultCreateTimeout
	}
	if cfg.RemoveTimeout <= 0 {
		cfg.RemoveTimeout = DefaultRemoveTimeout
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	g := &Gateway{cfg: cfg, unreachable: map[string]unreachable{}}
	podF := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = kubebox.IDLabel }))
	nodeF := informers.NewSharedInformerFactory(cfg.Client, 0)
	leaseF := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(corev1.NamespaceNodeLease))
	pi, ni, li := podF.Core().V1().Pods(), nodeF.Core().V1().Nodes(), leaseF.Coordination().V1().Leases()
	g.pods, g.nodes, g.leases = pi.Lister().Pods(cfg.Namespace), ni.Lister(), li.Lister().Leases(corev1.NamespaceNodeLease)
	g.synced = []cache.InformerSynced{pi.Informer().HasSynced, ni.Informer().HasSynced, li.Informer().HasSynced}
	g.factories = []informers.SharedInformerFactory{podF, nodeF, leaseF}
	g.transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: DefaultDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	g.client = &http.Client{Transport: g.transport, Timeout: 30 * time.Second}
	return g, nil
}

// Start starts the informers and waits (up to 60 s, or ctx) for their
// first lists; they run until ctx ends.
func (g *Gateway) Start(ctx context.Context) error {
	for _, f := range g.factories {
		f.Start(ctx.Done())
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), g.synced...) {
		return fmt.Errorf("gateway: the cluster's pods, nodes and leases were not listed within 60 s (is the API server reachable, and may this account list and watch them? deploy/kubernetes/gateway-rbac.yaml)")
	}
	return nil
}

// Close stops the node connections; the informers stop with Start's ctx.
func (g *Gateway) Close() {
	for _, f := range g.factories {
		f.Shutdown()
	}
	g.transport.CloseIdleConnections()
}

func notFound(id string) *server.Problem {
	return &server.Problem{Status: http.StatusNotFound, Code: server.CodeBoxNotFound,
		Detail: fmt.Sprintf("no box %q (airlock gateway: no pod %s%s or labelled %s=%s)", id, kubebox.PodNamePrefix, id, kubebox.NameLabel, id)}
}

// validID says whether id may be a gateway box's id (12 lowercase hex).
func validID(id string) bool {
	if len(id) != 12 {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func newID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// tenantOf is the tenant ctx's request comes from ("" for the admin,
// who sees every box).
func tenantOf(ctx context.Context) string {
	if t := server.TenantName(ctx); t != server.AdminTenant {
		return t
	}
	return ""
}

// sees says whether ctx's tenant may see pod p: its own, or any for the
// admin.
func sees(ctx context.Context, p *corev1.Pod) bool {
	t := tenantOf(ctx)
	return t == "" || p.Labels[kubebox.TenantLabel] == t
}

// nameSelectors are the label selectors of the pod of the box named name
// for ctx's tenant: a tenant's own name; for the admin, a box of its own
// (no tenant), else TENANT.NAME, a tenant's box as the admin sees it.
func nameSelectors(ctx context.Context, name string) []labels.Selector {
	own := func(tenant, name string) labels.Selector {
		if errs := validation.IsValidLabelValue(name); len(errs) > 0 || name == "" {
			return nil
		}
		r, err := labels.NewRequirement(kubebox.TenantLabel, selection.DoesNotExist, nil)
		if tenant != "" {
			r, err = labels.NewRequirement(kubebox.TenantLabel, selection.Equals, []string{tenant})
		}
		n, err2 := labels.NewRequirement(kubebox.NameLabel, selection.Equals, []string{name})
		if err != nil || err2 != nil {
			return nil
		}
		return labels.NewSelector().Add(*r, *n)
	}
	var out []labels.Selector
	if t := tenantOf(ctx); t != "" {
		out = append(out, own(t, name))
	} else {
		out = append(out, own("", name))
		if t, n, ok := strings.Cut(name, "."); ok {
			out = append(out, own(t, n))
		}
	}
	return slices.DeleteFunc(out, func(s labels.Selector) bool { return s == nil })
}

// findPod returns the pod of the box id names for ctx's tenant: its id
// (pod PodNamePrefix+id) or its name (label NameLabel), from the
// informer's cache, else from the API server. Another tenant's box is not
// found, exactly as one that does not exist.
func (g *Gateway) findPod(ctx context.Context, id string) (*corev1.Pod, error) {
	if validID(id) {
		name := kubebox.PodNamePrefix + id
		if p, err := g.pods.Get(name); err == nil && sees(ctx, p) {
			return p, nil
		}
		p, err := g.cfg.Client.CoreV1().Pods(g.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Labels[kubebox.IDLabel] == id && sees(ctx, p) {
			return p, nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, apiProblem(err)
		}
	}
	if len(id) > 128 || id == "" {
		return nil, notFound(id)
	}
	for _, sel := range nameSelectors(ctx, id) {
		if ps, err := g.pods.List(sel); err == nil && len(ps) == 1 {
			return ps[0], nil
		}
		list, err := g.cfg.Client.CoreV1().Pods(g.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return nil, apiProblem(err)
		}
		if len(list.Items) > 0 {
			return &list.Items[0], nil
		}
	}
	return nil, notFound(id)
}

// apiProblem is the problem for an error of the API server.
func apiProblem(err error) *server.Problem {
	if apierrors.IsNotFound(err) {
		return &server.Problem{Status: http.StatusNotFound, Code: server.CodeBoxNotFound, Detail: err.Error()}
	}
	return &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
		Detail: "the Kubernetes API server: " + err.Error()}
}

// nodeState is what the gateway knows of a node: the base URL of its API,
// or why its boxes are lost.
type nodeState struct {
	name string
	api  string // base URL (http://IP:PORT)
	lost string // why the node's boxes are lost ("" when they are not)
}

// node returns the state of the node named name. live reads the Node
// from the API server, not the cache (after a dial failure: the node may
// have come back on another address).
func (g *Gateway) node(ctx context.Context, name string, live bool) (nodeState, error) {
	st := nodeState{name: name}
	var n *corev1.Node
	var err error
	if !live {
		n, err = g.nodes.Get(name)
	}
	if live || err != nil {
		n, err = g.cfg.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		st.lost = fmt.Sprintf("node %s is gone from the cluster", name)
		return st, nil
	}
	if err != nil {
		return st, apiProblem(err)
	}
	st.api = n.Annotations[kubebox.APIAnnotation]
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			st.lost = fmt.Sprintf("node %s is NotReady since %s (%s: %s)", name, c.LastTransitionTime.UTC().Format(time.RFC3339), c.Reason, c.Message)
			return st, nil
		}
	}
	if l, err := g.leases.Get(name); err == nil && l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
		if end := l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second); time.Now().After(end) {
			st.lost = fmt.Sprintf("node %s's lease expired at %s", name, end.UTC().Format(time.RFC3339))
			return st, nil
		}
	}
	if !live {
		g.mu.Lock()
		u, ok := g.unreachable[name]
		g.mu.Unlock()
		if ok && time.Since(u.at) < unreachableFor {
			st.lost = fmt.Sprintf("node %s does not answer (%s)", name, u.err)
		}
	}
	return st, nil
}

// markUnreachable records that node name did not answer.
func (g *Gateway) markUnreachable(name string, err error) {
	g.mu.Lock()
	g.unreachable[name] = unreachable{time.Now(), err.Error()}
	g.mu.Unlock()
	g.cfg.Logf("node %s does not answer: %v", name, err)
}

func (g *Gateway) markReachable(name string) {
	g.mu.Lock()
	delete(g.unreachable, name)
	g.mu.Unlock()
}

// lostProblem is the problem of a call into a box whose node is lost.
func lostProblem(id, why string) *server.Problem {
	return &server.Problem{Status: http.StatusConflict, Code: server.CodeBoxLost,
		Detail: fmt.Sprintf("box %s is lost: %s. It is not recreated: remove it (DELETE /v1/boxes/%s) and create another", id, why, id)}
}

// ListBoxes implements server.Cluster: the boxes' pods from the cache
// (a tenant's: those with its TenantLabel), oldest first, with state lost for those on a lost node.
func (g *Gateway) ListBoxes(ctx context.Context) ([]server.Box, error) {
	sel := labels.Everything()
	if t := tenantOf(ctx); t != "" {
		sel = labels.SelectorFromSet(labels.Set{kubebox.TenantLabel: t})
	}
	pods, err := g.pods.List(sel)
	if err != nil {
		return nil, apiProblem(err)
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	nodes := map[string]nodeState{}
	out := make([]server.Box, 0, len(pods))
	for _, p := range pods {
		var ns *nodeState
		if n := p.Spec.NodeName; n != "" {
			st, ok := nodes[n]
			if !ok {
				st, err = g.node(ctx, n, false)
				if err != nil {
					return nil, err
				}
				nodes[n] = st
			}
			ns = &st
		}
		out = append(out, boxOfPod(p, ns))
	}
	return out, nil
}

// GetBox implements server.Cluster: the box as its node shows it, with
// the pod's id, name and labels; from the pod alone when it does not run
// (state lost when its node is lost or does not answer).
func (g *Gateway) GetBox(ctx context.Context, id string) (server.Box, error) {
	p, err := g.findPod(ctx, id)
	if err != nil {
		return server.Box{}, err
	}
	if p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
		return boxOfPod(p, nil), nil
	}
	st, err := g.node(ctx, p.Spec.NodeName, false)
	if err != nil {
		return server.Box{}, err
	}
	if st.lost != "" || st.api == "" || p.Status.Phase != corev1.PodRunning {
		return boxOfPod(p, &st), nil
	}
	b, err := g.nodeBox(ctx, st, p)
	if err != nil {
		if errors.As(err, new(*server.Problem)) {
			return server.Box{}, err
		}
		g.markUnreachable(st.name, err)
		st.lost = fmt.Sprintf("node %s does not answer (%v)", st.name, err)
		return boxOfPod(p, &st), nil
	}
	return b, nil
}

// RemoveBox implements server.Cluster: it deletes the pod and waits until
// it is gone (its node removed the box). A box on a lost node is deleted
// at once (grace period 0): its node removes the box if it comes back
// (kubenode's Adopt).
func (g *Gateway) RemoveBox(ctx context.Context, id string, force bool) error {
	p, err := g.findPod(ctx, id)
	if err != nil {
		return err
	}
	var st nodeState
	if p.Spec.NodeName != "" {
		if st, err = g.node(ctx, p.Spec.NodeName, false); err != nil {
			return err
		}
	}
	if st.lost == "" && st.api != "" {
		// The cache may not know yet that the node is gone: ask it.
		if err := g.probe(ctx, st); err != nil {
			g.markUnreachable(st.name, err)
			st.lost = fmt.Sprintf("node %s does not answer (%v)", st.name, err)
		}
	}
	if !force && st.lost == "" && p.Status.Phase == corev1.PodRunning {
		return &server.Problem{Status: http.StatusConflict, Code: server.CodeBoxRunning,
			Detail: fmt.Sprintf("box %s is running: stop it first, or remove it with force=true", id)}
	}
	// A box has no process to let end: a grace period of 1 s (virtual-
	// kubelet deletes the pod that long after its provider removed the
	// box), 0 (at once) on a lost node or before one.
	grace := int64(deleteGrace)
	if st.lost != "" || p.Spec.NodeName == "" {
		grace = 0
	}
	opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}, GracePeriodSeconds: &grace}
	if err := g.cfg.Client.CoreV1().Pods(g.cfg.Namespace).Delete(ctx, p.Name, opts); err != nil && !apierrors.IsNotFound(err) {
		return apiProblem(err)
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.RemoveTimeout)
	defer cancel()
	for {
		q, err := g.cfg.Client.CoreV1().Pods(g.cfg.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && q.UID != p.UID) {
			g.cfg.Logf("box %s removed (pod %s)", p.Labels[kubebox.IDLabel], p.Name)
			return nil
		}
		select {
		case <-ctx.Done():
			return &server.Problem{Status: http.StatusGatewayTimeout, Code: server.CodeTimeout,
				Detail: fmt.Sprintf("pod %s of box %s is still terminating after %s: its node %s has not removed the box yet; try again", p.Name, id, g.cfg.RemoveTimeout, p.Spec.NodeName)}
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// probe asks the node's API for its health (5 s at most); an error is its
// not answering.
func (g *Gateway) probe(ctx context.Context, st nodeState) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.api+"/v1/health", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+g.cfg.NodeToken)
	resp, err := g.client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	g.markReachable(st.name)
	return nil
}
