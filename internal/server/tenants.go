package server

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/tenant"
)

// Tenants (airlock serve --tenants FILE, docs/server.md): each token of
// the tenants file is a tenant, which sees and touches only its own boxes,
// snapshots and named volumes, within its quotas and grants. The server's
// own token (--token, AIRLOCK_TOKEN, server.token) and the unix socket are
// the admin: they see every box, as before tenants.
//
// A box's tenant is the label TenantLabel, set by the server on every
// create of a tenant (and carried by fork children, restores and pool
// claims); no client may set that label. Names of a tenant's boxes,
// snapshots and named volumes are stored with the prefix "TENANT.", so
// that tenants do not share a namespace (a name one tenant uses is no
// conflict for another) and the API shows them without it.

// TenantLabel is the box label that names the box's tenant. The server
// sets it; a create that names it is refused (400).
const TenantLabel = "airlock.tenant"

// AdminTenant is the name audit lines and the access log give the admin
// (the server's own token, the unix socket). No tenant may take it.
const AdminTenant = tenant.AdminName

type tenantCtxKey struct{}

// tenantOf returns the tenant a request comes from (nil: the admin).
func tenantOf(ctx context.Context) *tenant.Tenant {
	t, _ := ctx.Value(tenantCtxKey{}).(*tenant.Tenant)
	return t
}

// TenantName returns the name of the tenant whose request ctx carries
// (AdminTenant for the admin).
func TenantName(ctx context.Context) string {
	if t := tenantOf(ctx); t != nil {
		return t.Name
	}
	return AdminTenant
}

func ownerOf(labels map[string]string) string { return labels[TenantLabel] }

// sees says whether ctx's tenant may see a box with those labels.
func sees(ctx context.Context, labels map[string]string) bool {
	t := tenantOf(ctx)
	return t == nil || ownerOf(labels) == t.Name
}

// nsPrefix is the prefix of the stored names of ctx's tenant ("" for the
// admin).
func nsPrefix(ctx context.Context) string {
	if t := tenantOf(ctx); t != nil {
		return t.Name + "."
	}
	return ""
}

func ns(ctx context.Context, name string) string {
	if name == "" {
		return ""
	}
	return nsPrefix(ctx) + name
}

func unns(ctx context.Context, name string) string {
	return strings.TrimPrefix(name, nsPrefix(ctx))
}

// tenantProblem is problem(err) with the tenant's name prefix taken out
// of the detail (a name in use is shown as the tenant named it).
func tenantProblem(ctx context.Context, err error) error {
	p := problem(err)
	if pre := nsPrefix(ctx); pre != "" {
		if pp, ok := p.(*Problem); ok {
			pp.Detail = strings.ReplaceAll(pp.Detail, `"`+pre, `"`)
			pp.Detail = strings.ReplaceAll(pp.Detail, " "+pre, " ")
		}
	}
	return p
}

// own makes a create's options the tenant's: no client sets TenantLabel;
// a tenant's box gets it, and its name and named volumes are the
// tenant's (a create's from_snapshot is namespaced by its handler).
func own(ctx context.Context, opts *airlock.BoxOptions) error {
	if _, ok := opts.Labels[TenantLabel]; ok {
		return invalidField("/labels/"+escapePointer(TenantLabel),
			fmt.Sprintf("label %q is the server's own (it names the box's tenant): leave it out", TenantLabel))
	}
	t := tenantOf(ctx)
	if t == nil {
		return nil
	}
	opts.Labels = maps.Clone(opts.Labels)
	if opts.Labels == nil {
		opts.Labels = map[string]string{}
	}
	opts.Labels[TenantLabel] = t.Name
	opts.Name = ns(ctx, opts.Name)
	opts.Volumes = append([]airlock.Volume(nil), opts.Volumes...)
	for i, v := range opts.Volumes {
		if !v.IsHostDir() {
			opts.Volumes[i].Source = ns(ctx, v.Source)
		}
	}
	return nil
}

// view is b as ctx's tenant sees it: names without the tenant's prefix,
// and no tenant label (a tenant sees only its own boxes).
func view(ctx context.Context, b Box) Box {
	if tenantOf(ctx) == nil {
		return b
	}
	b.Name = unns(ctx, b.Name)
	if b.Labels != nil {
		b.Labels = maps.Clone(b.Labels)
		delete(b.Labels, TenantLabel)
		if len(b.Labels) == 0 {
			b.Labels = nil
		}
	}
	vols := make([]VolumeSpec, len(b.Volumes))
	for i, v := range b.Volumes {
		if !strings.HasPrefix(v.Source, "/") {
			v.Source = unns(ctx, v.Source)
		}
		vols[i] = v
	}
	if b.Volumes != nil {
		b.Volumes = vols
	}
	return b
}

func viewSnapshot(ctx context.Context, sn Snapshot) Snapshot {
	sn.Name = unns(ctx, sn.Name)
	sn.BoxName = unns(ctx, sn.BoxName)
	if tenantOf(ctx) != nil && sn.Labels[TenantLabel] != "" {
		sn.Labels = maps.Clone(sn.Labels)
		delete(sn.Labels, TenantLabel)
		if len(sn.Labels) == 0 {
			sn.Labels = nil
		}
	}
	return sn
}

// ownsSnapshot says whether the snapshot named name (as stored) is ctx's
// tenant's.
func ownsSnapshot(ctx context.Context, name string) bool {
	pre := nsPrefix(ctx)
	return pre == "" || strings.HasPrefix(name, pre)
}

func boxNotFound(s *Server, id string) error {
	home := ""
	if s.rt != nil {
		home = s.rt.Home()
	}
	return problem(fmt.Errorf("%w: %q in %s", airlock.ErrBoxNotFound, id, home))
}

// tenantBox resolves id (an id, unique id prefix or name) among the boxes
// of ctx's tenant only: another tenant's box is not found, exactly as a
// box that does not exist, and an id prefix is unique among the tenant's
// own boxes.
func (s *Server) tenantBox(ctx context.Context, id string) (*airlock.Box, error) {
	pre := nsPrefix(ctx)
	// Its own name first.
	if b, err := s.rt.Get(ctx, pre+id); err == nil {
		if info, err := b.Info(ctx); err == nil && sees(ctx, info.Options.Labels) {
			return b, nil
		}
	}
	if b, err := s.rt.Get(ctx, id); err == nil {
		if info, err := b.Info(ctx); err == nil && sees(ctx, info.Options.Labels) && info.Name != id {
			return b, nil // by id or id prefix, the only match in the home
		}
	}
	// Ambiguous in the home, or another's: match among its own.
	infos, err := s.rt.List(ctx)
	if err != nil {
		return nil, problem(err)
	}
	var match string
	for _, i := range infos {
		if !sees(ctx, i.Options.Labels) {
			continue
		}
		if i.ID == id {
			match = i.ID
			break
		}
		if strings.HasPrefix(i.ID, id) && id != "" {
			if match != "" {
				return nil, &Problem{Status: http.StatusConflict, Title: "Conflict", Code: CodeInvalid,
					Detail: fmt.Sprintf("box id prefix %q matches more than one of your boxes: give more of the id", id)}
			}
			match = i.ID
		}
	}
	if match == "" {
		return nil, boxNotFound(s, id)
	}
	b, err := s.rt.Get(ctx, match)
	if err != nil {
		return nil, boxNotFound(s, id)
	}
	return b, nil
}

// policyFor is the server's policy less the grants ctx's tenant does not
// have (the admin has them all).
func (s *Server) policyFor(ctx context.Context) (Policy, []string) {
	p, dirs := s.cfg.Policy, s.volumeDirs
	t := tenantOf(ctx)
	if t == nil {
		return p, dirs
	}
	g := t.Grants
	if !g.HostVolumes {
		dirs = nil
		p.AllowVolumeDirs = nil
	}
	if g.NoNamedVolumes {
		p.DenyNamedVolumes = true
	}
	if !g.HostPorts {
		p.AllowHostPorts = nil
	}
	if !g.PrivateNet {
		p.AllowPrivateNet = false
	}
	if !g.Publish {
		p.AllowPublish = nil
	}
	// No tenant grant for it: archives with checkpoints are imported for
	// the server's own token only.
	p.AllowImportState = false
	return p, dirs
}

// tenantUsage is what a tenant's boxes take, or what a request adds.
type tenantUsage struct {
	boxes, cpus, memMiB, diskMiB int
}

func (u *tenantUsage) add(v tenantUsage, sign int) {
	u.boxes += sign * v.boxes
	u.cpus += sign * v.cpus
	u.memMiB += sign * v.memMiB
	u.diskMiB += sign * v.diskMiB
}

// tenantState counts what a tenant's requests in progress are making, so
// that concurrent ones cannot pass its quotas together.
type tenantState struct {
	mu        sync.Mutex
	pending   map[string]tenantUsage // by tenant
	snapshots map[string]int
	owners    map[string]string // box id -> tenant ("" admin): for events
}

// usageOf returns what the boxes of tenant t take now (not counting
// requests in progress); their disk counts their checkpoints' bytes
// (with a Cluster: the boxes it lists, without checkpoints).
func (s *Server) usageOf(ctx context.Context, name string) (tenantUsage, error) {
	if s.cfg.Cluster != nil {
		boxes, err := s.cfg.Cluster.ListBoxes(ctx)
		if err != nil {
			return tenantUsage{}, clusterProblem(err)
		}
		return clusterUsage(boxes, name), nil
	}
	infos, err := s.rt.List(ctx)
	if err != nil {
		return tenantUsage{}, problem(err)
	}
	var u tenantUsage
	for _, i := range infos {
		if ownerOf(i.Options.Labels) != name {
			continue
		}
		u.diskMiB += i.Options.DiskSizeMiB
		// And what its checkpoints take on disk.
		if b, err := s.rt.Get(ctx, i.ID); err == nil {
			u.diskMiB += int((b.CheckpointsSize() + 1<<20 - 1) >> 20)
		}
		if i.State != airlock.BoxStopped {
			u.boxes++
			u.cpus += i.Options.CPUs
			u.memMiB += i.Options.MemoryMiB
		}
	}
	return u, nil
}

func quotaDenied(t *tenant.Tenant, format string, a ...any) *Problem {
	return &Problem{Status: http.StatusForbidden, Title: "Forbidden", Code: CodeQuotaExceeded,
		Detail: fmt.Sprintf("tenant %s: ", t.Name) + fmt.Sprintf(format, a...)}
}

// reserveQuota checks that want more (boxes not stopped, their vCPUs and
// memory, disks) keeps ctx's tenant within its quotas, and counts it as
// taken until release is called. The admin has no quota.
func (s *Server) reserveQuota(ctx context.Context, want tenantUsage, what string) (release func(), err error) {
	t := tenantOf(ctx)
	if t == nil {
		return func() {}, nil
	}
	q := s.quotaOf(t) // the file as reloaded
	ts := &s.tenants
	ts.mu.Lock()
	defer ts.mu.Unlock()
	u, err := s.usageOf(ctx, t.Name)
	if err != nil {
		return nil, err
	}
	u.add(ts.pending[t.Name], 1)
	if err := checkQuota(t, q, u, want, what); err != nil {
		return nil, err
	}
	if ts.pending == nil {
		ts.pending = map[string]tenantUsage{}
	}
	p := ts.pending[t.Name]
	p.add(want, 1)
	ts.pending[t.Name] = p
	var once sync.Once
	return func() {
		once.Do(func() {
			ts.mu.Lock()
			p := ts.pending[t.Name]
			p.add(want, -1)
			ts.pending[t.Name] = p
			ts.mu.Unlock()
		})
	}, nil
}

// reserveTenantSnapshot checks ctx's tenant's snapshot quota and counts
// one more as being taken until release.
func (s *Server) reserveTenantSnapshot(ctx context.Context) (release func(), err error) {
	t := tenantOf(ctx)
	if t == nil {
		return func() {}, nil
	}
	q := t.Quota
	if cur, ok := s.cfg.Tenants.Get(t.Name); ok {
		q = cur.Quota
	}
	ts := &s.tenants
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if q.Snapshots > 0 {
		list, err := s.snapshots(ctx)
		if err != nil {
			return nil, err
		}
		n := ts.snapshots[t.Name]
		for _, sn := range list {
			if ownsSnapshot(ctx, sn.Name) {
				n++
			}
		}
		if n >= q.Snapshots {
			return nil, quotaDenied(t, "%d snapshots exist or are being taken, your quota (airlock tenant add --max-snapshots): remove one first (DELETE /v1/snapshots/{name})", n)
		}
	}
	if ts.snapshots == nil {
		ts.snapshots = map[string]int{}
	}
	ts.snapshots[t.Name]++
	var once sync.Once
	return func() {
		once.Do(func() {
			ts.mu.Lock()
			ts.snapshots[t.Name]--
			ts.mu.Unlock()
		})
	}, nil
}

func usageOfOptions(o airlock.BoxOptions, n int) tenantUsage {
	cpus, mem, disk := o.CPUs, o.MemoryMiB, o.DiskSizeMiB
	if cpus == 0 {
		cpus = airlock.DefaultCPUs
	}
	if mem == 0 {
		mem = airlock.DefaultMemoryMiB
	}
	if disk == 0 {
		disk = airlock.DefaultDiskSizeMiB
	}
	return tenantUsage{boxes: n, cpus: n * cpus, memMiB: n * mem, diskMiB: n * disk}
}

// noteOwner remembers box id's tenant, for the event stream.
func (s *Server) noteOwner(id string, labels map[string]string) {
	ts := &s.tenants
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.owners == nil {
		ts.owners = map[string]string{}
	}
	if len(ts.owners) > 1<<16 { // bounded: forget the lot, rebuilt on demand
		clear(ts.owners)
	}
	ts.owners[id] = ownerOf(labels)
}

// eventVisible says whether ctx's tenant may see ev: events of its own
// boxes, and those of no box. A box whose tenant cannot be learnt (gone
// before the server saw it) is the admin's alone.
func (s *Server) eventVisible(ctx context.Context, ev Event) bool {
	t := tenantOf(ctx)
	if t == nil || ev.BoxID == "" {
		return true
	}
	ts := &s.tenants
	ts.mu.Lock()
	owner, ok := ts.owners[ev.BoxID]
	ts.mu.Unlock()
	if !ok && s.rt != nil {
		b, err := s.rt.Get(ctx, ev.BoxID)
		if err != nil {
			return false
		}
		info, err := b.Info(ctx)
		if err != nil {
			return false
		}
		s.noteOwner(info.ID, info.Options.Labels)
		owner = ownerOf(info.Options.Labels)
	}
	return owner == t.Name
}

// adminOnly serves next to the admin only: a tenant gets 403 (the
// server's metrics count every tenant's boxes and requests).
func adminOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t := tenantOf(r.Context()); t != nil {
			writeProblem(w, &Problem{Status: http.StatusForbidden, Title: "Forbidden", Code: CodePolicyDenied,
				Detail: fmt.Sprintf("tenant %s: %s is the operator's (the server's own token, or the unix socket)", t.Name, r.URL.Path)})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// maxMCPOwners bounds the MCP sessions whose tenant mcpTenants keeps.
const maxMCPOwners = 4096

// mcpTenants binds each MCP session to the tenant that opened it: the
// session id (Mcp-Session-Id) is learnt from the answer to its
// initialize, and a request on it from anyone else is 404, as a session
// that does not exist. A tenant's request on a session the server does
// not know is 404 too (its own are always known); the admin's passes, for
// the MCP handler to answer. Its boxes are the tenant's: the session's
// calls run under the initialize request's context, whose tenant
// CheckBox and AcquireExec see.
func (s *Server) mcpTenants(next http.Handler) http.Handler {
	var mu sync.Mutex
	owners := map[string]string{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := TenantName(r.Context())
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			mu.Lock()
			owner, ok := owners[id]
			if ok && r.Method == http.MethodDelete && owner == who {
				delete(owners, id)
			}
			mu.Unlock()
			if (ok && owner != who) || (!ok && tenantOf(r.Context()) != nil) {
				writeProblem(w, &Problem{Status: http.StatusNotFound, Title: "Not Found", Code: CodeNotFound,
					Detail: "no MCP session " + id + ": open one (initialize) without Mcp-Session-Id"})
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(&sessionNoter{ResponseWriter: w, note: func(id string) {
			mu.Lock()
			defer mu.Unlock()
			if len(owners) >= maxMCPOwners {
				for k := range owners { // forget one: its tenant's calls on it get 404
					delete(owners, k)
					break
				}
			}
			owners[id] = who
		}}, r)
	})
}

// sessionNoter passes the Mcp-Session-Id of a response to note, once,
// before the response goes out.
type sessionNoter struct {
	http.ResponseWriter
	note  func(id string)
	noted bool
}

func (w *sessionNoter) check() {
	if !w.noted {
		w.noted = true
		if id := w.Header().Get("Mcp-Session-Id"); id != "" {
			w.note(id)
		}
	}
}

func (w *sessionNoter) WriteHeader(code int) { w.check(); w.ResponseWriter.WriteHeader(code) }

func (w *sessionNoter) Write(b []byte) (int, error) { w.check(); return w.ResponseWriter.Write(b) }

func (w *sessionNoter) Flush() {
	w.check()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *sessionNoter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
