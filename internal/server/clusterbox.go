package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/tenant"
)

// clusterCreate is POST /v1/boxes on a Cluster. A tenant's box gets its
// label and name space (as own does for airlock serve), and its quotas
// are checked twice: against the boxes the Cluster lists now and the
// creates in progress here (reserveQuota), then by the Cluster once the
// box's record exists, against every box of the tenant it holds (admit),
// so that creates through other gateways count too.
func (s *Server) clusterCreate(ctx context.Context, sp BoxSpec) (*boxOutput, error) {
	if _, ok := sp.Labels[TenantLabel]; ok {
		return nil, invalidField("/labels/"+escapePointer(TenantLabel),
			fmt.Sprintf("label %q is the server's own (it names the box's tenant): leave it out", TenantLabel))
	}
	if err := s.clusterGrants(ctx, &sp); err != nil {
		return nil, err
	}
	if sp.FromSnapshot != "" {
		if sp.Image == airlock.DefaultImage {
			sp.Image = "" // huma's default: the snapshot names its image
		}
		sp.FromSnapshot = ns(ctx, sp.FromSnapshot)
	}
	t0 := time.Now()
	t := tenantOf(ctx)
	if t == nil {
		b, err := s.cfg.Cluster.CreateBox(ctx, sp, nil)
		s.clusterStarted(b.ID, t0, err)
		if err != nil {
			return nil, clusterProblem(err)
		}
		return &boxOutput{Body: b}, nil
	}
	sp.Labels = maps.Clone(sp.Labels)
	if sp.Labels == nil {
		sp.Labels = map[string]string{}
	}
	sp.Labels[TenantLabel] = t.Name
	sp.Name = ns(ctx, sp.Name)
	want := usageOfOptions(airlock.BoxOptions{CPUs: sp.CPUs, MemoryMiB: sp.MemoryMiB, DiskSizeMiB: sp.DiskSizeMiB}, 1)
	what := fmt.Sprintf("a box with %d vCPUs, %d MiB of memory and a disk of %d MiB", want.cpus, want.memMiB, want.diskMiB)
	release, err := s.reserveQuota(ctx, want, what)
	if err != nil {
		return nil, err
	}
	defer release()
	admit := func(boxes []Box) error {
		have := clusterUsage(boxes, t.Name)
		have.add(want, -1) // the new box is among them
		return checkQuota(t, s.quotaOf(t), have, want, what)
	}
	b, err := s.cfg.Cluster.CreateBox(ctx, sp, admit)
	s.clusterStarted(b.ID, t0, err)
	if err != nil {
		return nil, tenantProblem(ctx, clusterProblem(err))
	}
	return &boxOutput{Body: view(ctx, b)}, nil
}

// clusterGrants applies the policy's grants (the request's tenant's) to a
// Cluster's create, as checkGrants does for airlock serve: published
// ports (--allow-publish, normalised in sp), allow_host_ports, allow_net
// and named volumes. Host directory volumes are the node's to grant
// (airlock node --allow-volume, checked where the directory is); here
// only a tenant without the host-volume grant is refused.
func (s *Server) clusterGrants(ctx context.Context, sp *BoxSpec) error {
	p, _ := s.policyFor(ctx)
	opts := airlock.BoxOptions{AllowNet: sp.AllowNet, AllowHostPorts: sp.AllowHostPorts}
	for _, pm := range sp.Ports {
		opts.Ports = append(opts.Ports, airlock.PortMapping{HostIP: pm.HostIP, HostPort: pm.HostPort, GuestPort: pm.GuestPort, Protocol: pm.Protocol})
	}
	if err := s.checkPorts(p, &opts); err != nil {
		return err
	}
	for i, pm := range opts.Ports {
		sp.Ports[i] = portSpecOf(pm)
	}
	for _, port := range sp.AllowHostPorts {
		if !slices.Contains(p.AllowHostPorts, port) {
			return denied("allow_host_ports %d: this gateway grants host ports %v (airlock gateway --allow-host-port)", port, p.AllowHostPorts)
		}
	}
	if err := checkAllowNet(p, sp.AllowNet); err != nil {
		return err
	}
	for _, v := range sp.Volumes {
		vol := airlock.Volume{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly}
		switch {
		case !vol.IsHostDir() && p.DenyNamedVolumes:
			return denied("named volume %q: this server refuses named volumes", v.Source)
		case vol.IsHostDir() && tenantOf(ctx) != nil && !tenantOf(ctx).Grants.HostVolumes:
			return denied("host volume %s: your tenant is not granted host volumes (its host_volumes grant in the tenants file)", v.Source)
		}
	}
	return nil
}

// clusterStarted counts a Cluster's create in the metrics as a box start
// (airlock_box_starts_total): made, or failed on its node (a problem of
// status 5xx); a refusal (quota, no node for it, a bad request) is none.
func (s *Server) clusterStarted(id string, t0 time.Time, err error) {
	p, _ := clusterProblem(err).(*Problem)
	if err == nil || p.Status >= 500 {
		s.cfg.Metrics.BoxStarted(airlock.BoxStartEvent{BoxID: id, Duration: time.Since(t0), Err: err})
	}
}

// clusterUsage is what the boxes of tenant name among boxes take (a
// Cluster's list).
func clusterUsage(boxes []Box, name string) tenantUsage {
	var u tenantUsage
	for _, b := range boxes {
		if ownerOf(b.Labels) != name {
			continue
		}
		o := usageOfOptions(airlock.BoxOptions{CPUs: b.CPUs, MemoryMiB: b.MemoryMiB, DiskSizeMiB: b.DiskSizeMiB}, 1)
		u.diskMiB += o.diskMiB
		if b.State != string(airlock.BoxStopped) {
			u.boxes++
			u.cpus += o.cpus
			u.memMiB += o.memMiB
		}
	}
	return u
}

// quotaOf is t's quota as the tenants file says now (reloaded).
func (s *Server) quotaOf(t *tenant.Tenant) tenant.Quota {
	if cur, ok := s.cfg.Tenants.Get(t.Name); ok {
		return cur.Quota
	}
	return t.Quota
}

// checkQuota says whether adding want to have keeps t within q.
func checkQuota(t *tenant.Tenant, q tenant.Quota, have, want tenantUsage, what string) error {
	check := func(have, add, limit int, unit, flag string) error {
		if limit > 0 && add > 0 && have+add > limit {
			return quotaDenied(t, "%s: your boxes take %d %s and this would add %d, past your quota of %d (airlock tenant add --%s): stop or remove boxes first, or ask for less",
				what, have, unit, add, limit, flag)
		}
		return nil
	}
	for _, c := range []error{
		check(have.boxes, want.boxes, q.Boxes, "boxes not stopped", "max-boxes"),
		check(have.cpus, want.cpus, q.CPUs, "vCPUs", "max-cpus"),
		check(have.memMiB, want.memMiB, q.MemoryMiB, "MiB of memory", "max-memory"),
		check(have.diskMiB, want.diskMiB, q.DiskMiB, "MiB of disk", "max-disk"),
	} {
		if c != nil {
			return c
		}
	}
	return nil
}

// clusterExecKinds are the per-box routes of a Cluster that run
// something (by method and the path after /v1/boxes/{id}/): each takes an
// exec slot of its client (--max-execs, a tenant's execs quota) and
// writes an audit entry, as airlock serve's own handlers do.
func clusterExecKind(method, rest string) string {
	switch {
	case method == http.MethodPost && rest == "exec":
		return "exec"
	case method == http.MethodGet && rest == "exec/ws":
		return "exec_stream"
	case method == http.MethodPost && rest == "code/run":
		return "code_run"
	case method == http.MethodPost && rest == "code/install":
		return "install"
	case method == http.MethodPost && strings.HasPrefix(rest, "contexts/") && strings.HasSuffix(rest, "/run"):
		return "cell"
	}
	return ""
}

// auditHead bounds what serveClusterBox keeps of a request and a
// response to write their audit entry.
const auditHead = 64 << 10

// serveClusterBox hands a per-box request to the Cluster; one that runs
// something first takes an exec slot of the client and then gets its
// audit entry: the command or code (from the request), the exit code
// (from the answer, when it is a buffered result; a stream's frames pass
// through unread), the tenant and the request id.
func (s *Server) serveClusterBox(w http.ResponseWriter, r *http.Request, id string) {
	kind := clusterExecKind(r.Method, strings.TrimPrefix(r.URL.Path, "/v1/boxes/"+id+"/"))
	if kind == "" {
		s.cfg.Cluster.ServeBox(w, r, id)
		return
	}
	release, err := s.acquire(r.Context())
	if err != nil {
		writeProblem(w, err.(*Problem))
		return
	}
	defer release()
	t0 := time.Now()
	req := &headReader{ReadCloser: r.Body}
	r.Body = req
	cw := &headWriter{ResponseWriter: w}
	s.cfg.Cluster.ServeBox(cw, r, id)
	e := AuditEntry{Kind: kind, BoxID: id}
	var in struct {
		Cmd      []string `json:"cmd"`
		Code     string   `json:"code"`
		Packages []string `json:"packages"`
	}
	if json.Unmarshal(req.head.Bytes(), &in) == nil {
		e.Cmd, e.Code = in.Cmd, in.Code
		if kind == "install" {
			e.Cmd = append([]string{"pip", "install"}, in.Packages...)
		}
	}
	var errOut error
	switch status := cw.status; {
	case status >= 400:
		var p Problem
		json.Unmarshal(cw.head.Bytes(), &p)
		errOut = fmt.Errorf("%d %s: %s", status, p.Code, p.Detail)
	case status == http.StatusOK:
		var res struct {
			ExitCode *int `json:"exit_code"`
			TimedOut bool `json:"timed_out"`
		}
		if !cw.cut && json.Unmarshal(cw.head.Bytes(), &res) == nil {
			e.ExitCode, e.TimedOut = res.ExitCode, res.TimedOut
		} else if n, ok := leadingExitCode(cw.head.Bytes()); ok {
			e.ExitCode = &n // an exec's result starts with it
		}
	}
	// The metrics count execs as the node's Runtime would
	// (airlock_execs_total): those that ran, or failed on the node (5xx).
	if kind == "exec" || kind == "exec_stream" {
		if ev := (airlock.ExecEvent{BoxID: id, Duration: time.Since(t0), TimedOut: e.TimedOut}); cw.status < 400 {
			if e.ExitCode != nil {
				ev.ExitCode = *e.ExitCode
			}
			s.cfg.Metrics.ExecEnded(ev)
		} else if cw.status >= 500 {
			ev.Err = errOut
			s.cfg.Metrics.ExecEnded(ev)
		}
	}
	s.audit(r.Context(), e, t0, errOut) // last: a test that sees it sees the metrics
}

// leadingExitCode reads N from a body that starts {"exit_code":N.
func leadingExitCode(b []byte) (int, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(`{"exit_code":`))
	if !ok {
		return 0, false
	}
	end := bytes.IndexAny(rest, ",}")
	if end < 0 {
		return 0, false
	}
	n, err := strconv.Atoi(string(rest[:end]))
	return n, err == nil
}

// headReader keeps the first auditHead bytes read from a request body.
type headReader struct {
	io.ReadCloser
	head bytes.Buffer
}

func (r *headReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if room := auditHead - r.head.Len(); room > 0 {
		r.head.Write(p[:min(n, room)])
	}
	return n, err
}

// headWriter keeps a response's status and its first auditHead bytes
// (cut: there were more). Unwrap lets the Cluster's proxy flush and
// hijack the connection (a WebSocket upgrade; then status stays 0).
type headWriter struct {
	http.ResponseWriter
	status int
	head   bytes.Buffer
	cut    bool
}

func (w *headWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *headWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if room := auditHead - w.head.Len(); room > 0 {
		w.head.Write(b[:min(len(b), room)])
		w.cut = w.cut || len(b) > room
	} else if len(b) > 0 {
		w.cut = true
	}
	return w.ResponseWriter.Write(b)
}

func (w *headWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// clusterUnserved says why a route is not served with a Cluster, and
// what to do instead.
func clusterUnserved(pattern string) string {
	_, path, _ := strings.Cut(pattern, " ")
	switch {
	case path == "/v1/events":
		return "a box's events are its node's: watch the boxes' pods instead (kubectl get pods -l airlock.dev/box-id -w; their phase and conditions follow the boxes), or poll GET /v1/boxes/{id}"
	case strings.HasPrefix(path, "/v1/images"):
		return "images are each node's own: the node that runs a box pulls its image when the box is created (a failed pull is 404 image_not_found, naming the node)"
	case path == "/v1/pools":
		return "the gateway keeps no warm pool: each create makes a pod, placed by the Kubernetes scheduler (a node's own airlock serve --pool keeps one on that node)"
	case strings.HasPrefix(path, "/v1/snapshots"):
		return "memory snapshots stay on the node that took them, and the gateway restores none: use checkpoints instead (POST /v1/boxes/{id}/checkpoints, then /rollback), which stay with their box"
	}
	return "call the node's own airlock serve for it"
}
