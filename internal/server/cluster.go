package server

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
)

// Cluster serves the boxes from somewhere other than a local Runtime:
// airlock gateway (internal/gateway) implements it over the pods of a
// Kubernetes cluster. A Server with Config.Cluster set serves the same
// OpenAPI document, auth, limits, problem details, access log and metrics
// as airlock serve; the box collection (create, list, get, remove) calls
// the Cluster, every other route under /v1/boxes/{id}/ is handed to
// ServeBox (which proxies it to the node running the box), and the routes
// a cluster does not serve yet answer 501 not_supported.
//
// Errors a Cluster returns are shown as they are when they are *Problem;
// others are 500 internal.
//
// Tenants (Config.Tenants) are served as by airlock serve: the Server
// gives a tenant's create the label TenantLabel and the name TENANT.NAME
// (the spec's), checks its quotas, and shows the boxes without them. A
// Cluster scopes every call by the tenant of its ctx (TenantName; the
// admin, AdminTenant, sees every box): a box of another tenant is not
// found, exactly as one that does not exist.
type Cluster interface {
	// CreateBox makes a box and returns it once it runs. admit, when not
	// nil (a tenant's create), is called once the box's record exists in
	// the cluster, before it runs, with every box of the spec's tenant
	// (its TenantLabel) that the cluster then holds, the new one
	// included, read from the cluster itself (not a cache): an error from
	// admit removes the new box and is CreateBox's. So a tenant's quotas
	// hold across any number of gateways (two creates racing for its last
	// room may both be refused, never both admitted).
	CreateBox(ctx context.Context, spec BoxSpec, admit func([]Box) error) (Box, error)
	// ListBoxes returns every box of the cluster that ctx's tenant sees,
	// oldest first.
	ListBoxes(ctx context.Context) ([]Box, error)
	// GetBox returns the box id names (its id or name) if ctx's tenant
	// sees it.
	GetBox(ctx context.Context, id string) (Box, error)
	// RemoveBox removes the box id names and returns once it is gone; a
	// running box needs force (else 409 box_running, as airlock serve).
	RemoveBox(ctx context.Context, id string, force bool) error
	// ServeBox answers a request under /v1/boxes/{id}/ for the box id
	// names (authenticated and bounded by the Server already, and taking
	// an exec slot of the client when it runs something).
	ServeBox(w http.ResponseWriter, r *http.Request, id string)
}

// ClusterSnapshots is a Cluster that also serves memory snapshots and
// forks (airlock gateway: on the node that runs the box, the children
// and restores pinned there). The Server applies tenants as airlock
// serve does: names are given and listed as stored (TENANT.NAME for a
// tenant's), the Server filters and shows them; a tenant's snapshot quota
// counts Snapshots.
type ClusterSnapshots interface {
	// SnapshotBox takes a memory snapshot named name of the box id names.
	SnapshotBox(ctx context.Context, id, name string) (Snapshot, error)
	// Snapshots lists every snapshot of the cluster, oldest first.
	Snapshots(ctx context.Context) ([]Snapshot, error)
	// Snapshot returns the snapshot named name (404 snapshot_not_found).
	Snapshot(ctx context.Context, name string) (Snapshot, error)
	// RemoveSnapshot removes the snapshot named name.
	RemoveSnapshot(ctx context.Context, name string) error
	// ForkBox forks the box id names into n children and returns them
	// running; admit, when not nil, is called as CreateBox calls it, once
	// per child (each with the boxes of the tenant, the children made so
	// far included). On error no child is left.
	ForkBox(ctx context.Context, id string, n int, fromCheckpoint string, admit func([]Box) error) ([]Box, error)
}

// ClusterEvents is a Cluster that feeds the Server's event stream
// (/v1/events, with Config.Events set): RunEvents calls publish with each
// event of its boxes (BoxID the Cluster's id, labels the box's, which
// name its tenant; Seq is the Server's own) until ctx ends.
type ClusterEvents interface {
	RunEvents(ctx context.Context, publish func(ev Event, labels map[string]string))
}

// clusterServes says whether the Server serves the route of pattern
// itself for its Cluster (snapshots, forks and events, when the Cluster
// has them).
func (s *Server) clusterServes(method, path string) bool {
	_, snaps := s.cfg.Cluster.(ClusterSnapshots)
	_, evs := s.cfg.Cluster.(ClusterEvents)
	switch {
	case snaps && method == http.MethodPost && (strings.HasSuffix(path, "/snapshot") || strings.HasSuffix(path, "/fork")) && perBoxPath.MatchString(path) && strings.Count(path, "/") == 4:
		return true
	case snaps && (path == "/v1/snapshots" || strings.HasPrefix(path, "/v1/snapshots/")):
		return true
	case evs && s.events != nil && path == "/v1/events":
		return true
	}
	return false
}

// CodeBoxLost: the box's node stopped answering or is NotReady (airlock
// gateway; 409): its box is reported with state lost, never recreated
// silently. Remove it and create another.
const CodeBoxLost = "box_lost"

// CodeUnschedulable: no node can take the box (airlock gateway; 409): the
// detail is the scheduler's message (0/2 nodes are available: ...).
const CodeUnschedulable = "unschedulable"

// BoxLost is the state of a box whose node is lost (airlock gateway).
const BoxLost = "lost"

// perBoxPath matches the routes under one box: /v1/boxes/{id}/...
var perBoxPath = regexp.MustCompile(`^/v1/boxes/([^/]+)/.`)

// clusterRoutes are the routes a Server with a Cluster serves itself
// under /v1 (the box collection and the server's own); every other /v1
// route but the per-box ones answers 501 (/openapi.json, /metrics and /mcp
// are the server's).
var clusterRoutes = map[string]bool{
	"POST /v1/boxes": true, "GET /v1/boxes": true, "GET /v1/boxes/{id}": true, "DELETE /v1/boxes/{id}": true,
	"GET /v1/health": true, "GET /v1/version": true,
}

// cluster routes a request of a Server with a Cluster: per-box routes to
// Cluster.ServeBox, the box collection and the server's own routes to the
// mux, others to 501.
func (s *Server) cluster(mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.clusterServes(r.Method, r.URL.Path) {
			mux.ServeHTTP(w, r)
			return
		}
		if m := perBoxPath.FindStringSubmatch(r.URL.Path); m != nil {
			s.serveClusterBox(w, r, m[1])
			return
		}
		if _, pat := s.mux.Handler(r); strings.Contains(pat, " /v1/") && !clusterRoutes[pat] {
			writeProblem(w, &Problem{Status: http.StatusNotImplemented, Code: CodeNotSupported,
				Detail: fmt.Sprintf("%s %s is not served by airlock gateway: %s", r.Method, r.URL.Path, clusterUnserved(pat))})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// WriteProblem writes p as an application/problem+json response (for a
// Cluster's ServeBox).
func WriteProblem(w http.ResponseWriter, p *Problem) { writeProblem(w, p) }

// labelFilter parses GET /v1/boxes' label parameters and returns the
// filter they make.
func labelFilter(labels []string) (func(map[string]string) bool, error) {
	type want struct {
		k, v string
		any  bool
	}
	var ws []want
	for _, l := range labels {
		k, v, hasValue := strings.Cut(l, "=")
		if k == "" {
			return nil, invalidParam("query", "label", fmt.Sprintf("label %q: want KEY=VALUE or KEY", l))
		}
		ws = append(ws, want{k, v, !hasValue})
	}
	return func(m map[string]string) bool {
		for _, w := range ws {
			if v, ok := m[w.k]; !ok || (!w.any && v != w.v) {
				return false
			}
		}
		return true
	}, nil
}

// clusterProblem passes a Cluster's *Problem on and makes others 500s.
func clusterProblem(err error) error {
	if err == nil {
		return nil
	}
	if p, ok := err.(*Problem); ok {
		return p
	}
	return &Problem{Status: http.StatusInternalServerError, Code: CodeInternal, Detail: err.Error()}
}
