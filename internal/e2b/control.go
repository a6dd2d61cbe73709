package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
)

// controlMux is the control plane: E2B's sandbox calls that the SDKs make.
func (s *Server) controlMux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("POST /sandboxes", s.create)
	m.HandleFunc("POST /v2/sandboxes", s.create)
	m.HandleFunc("POST /v3/sandboxes", s.create)
	m.HandleFunc("GET /sandboxes", s.list)
	m.HandleFunc("GET /v2/sandboxes", s.list)
	m.HandleFunc("GET /sandboxes/{id}", s.get)
	m.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	m.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	m.HandleFunc("POST /sandboxes/{id}/refreshes", s.refresh)
	m.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	m.HandleFunc("POST /sandboxes/{id}/resume", s.connect)
	m.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
	m.HandleFunc("GET /sandboxes/{id}/metrics", s.metrics)
	m.HandleFunc("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	m.HandleFunc("GET /snapshots", s.listSnapshots)
	m.HandleFunc("DELETE /templates/{id}", s.deleteSnapshot)
	m.HandleFunc("POST /sandboxes/{id}/fork", s.fork)
	m.HandleFunc("PUT /sandboxes/{id}/network", s.updateNetwork)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not answered by airlock's E2B API (see docs/e2b.md for what is)", r.Method, r.URL.Path))
	})
	return m
}

// newSandbox is the body of a create (E2B's NewSandbox and NewSandboxV2).
type newSandboxBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *struct {
		Enabled *bool `json:"enabled"`
	} `json:"autoResume"`
	Network      *egress         `json:"network"`
	VolumeMounts []volumeMount   `json:"volumeMounts"`
	MCP          json.RawMessage `json:"mcp"`
	IAM          json.RawMessage `json:"iam"`
}

// volumeMount is E2B's SandboxVolumeMount: a volume by name, at a path.
type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// maxVolumeMounts bounds a create's volumeMounts.
const maxVolumeMounts = 16

// volumeName is what an E2B volume name may be here: an airlock volume
// name, never a host path.
var volumeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// volumesOf maps E2B's volume mounts onto airlock's named volumes
// (BoxOptions.Volumes): each name is a volume of the airlock home, made
// empty on first use and kept when the sandbox is killed; the server's
// policy on named volumes applies (CheckBox).
func volumesOf(ms []volumeMount) ([]airlock.Volume, error) {
	if len(ms) > maxVolumeMounts {
		return nil, badRequest("volumeMounts: at most %d", maxVolumeMounts)
	}
	var out []airlock.Volume
	for _, m := range ms {
		if !volumeName.MatchString(m.Name) {
			return nil, badRequest("volumeMounts name %q: want a volume name (letters, digits, _ . -; at most 128)", m.Name)
		}
		if !path.IsAbs(m.Path) || path.Clean(m.Path) == "/" || len(m.Path) > 4096 {
			return nil, badRequest("volumeMounts path %q: want an absolute path other than /", m.Path)
		}
		out = append(out, airlock.Volume{Source: m.Name, Target: path.Clean(m.Path)})
	}
	return out, nil
}

// mountsOf is the named volumes of o as E2B's volume mounts.
func mountsOf(o airlock.BoxOptions) []volumeMount {
	out := []volumeMount{}
	for _, v := range o.Volumes {
		if !v.IsHostDir() {
			out = append(out, volumeMount{Name: v.Source, Path: v.Target})
		}
	}
	return out
}

// The labels that keep a sandbox's lifecycle (E2B's autoPause and
// autoResume): onTimeoutLabel "pause" when its timeout pauses it, and
// autoResumeLabel "true" when a call wakes it.
const (
	onTimeoutLabel  = labelPrefix + "on-timeout"
	autoResumeLabel = labelPrefix + "auto-resume"
)

// autoPauses reports whether the sandbox's timeout pauses it.
func autoPauses(o airlock.BoxOptions) bool { return o.Labels[onTimeoutLabel] == "pause" }

// autoResumes reports whether a call to the paused sandbox resumes it.
func autoResumes(o airlock.BoxOptions) bool {
	return autoPauses(o) && o.Labels[autoResumeLabel] == "true"
}

// lifecycleInfo is E2B's lifecycle of a sandbox's details.
type lifecycleInfo struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

func lifecycleOf(o airlock.BoxOptions) lifecycleInfo {
	if autoPauses(o) {
		return lifecycleInfo{AutoResume: autoResumes(o), OnTimeout: "pause"}
	}
	return lifecycleInfo{OnTimeout: "kill"}
}

// setTimeout gives the sandbox of b a new timeout from now: its TTL, or
// for a sandbox whose timeout pauses it (autoPause) its idle timeout.
func setTimeout(ctx context.Context, b *airlock.Box, o airlock.BoxOptions, d time.Duration) error {
	if autoPauses(o) {
		return b.SetIdleTimeout(ctx, d)
	}
	return b.SetTTL(ctx, d)
}

// created is E2B's Sandbox: the answer to a create or connect.
type created struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias,omitempty"`
}

// listed is E2B's ListedSandbox; detail (SandboxDetail) adds to it.
type listed struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

type detail struct {
	listed
	EnvdAccessToken     string        `json:"envdAccessToken"`
	AllowInternetAccess bool          `json:"allowInternetAccess"`
	Domain              *string       `json:"domain"`
	Network             *networkInfo  `json:"network,omitempty"`
	Lifecycle           lifecycleInfo `json:"lifecycle"`
	VolumeMounts        []volumeMount `json:"volumeMounts"`
}

// clientID is what E2B names the node a sandbox runs on.
const clientID = "airlock"

// decodeBody reads a JSON body of at most the configured size.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	b, err := io.ReadAll(r.Body)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return fmt.Errorf("%w: the body is over the server's limit of %d bytes", errTooLarge, s.cfg.MaxBodyBytes)
	}
	if err != nil {
		return badRequest("read the body: %v", err)
	}
	if len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return badRequest("body: %v", err)
	}
	return nil
}

// timeoutOf checks a timeout in seconds.
func timeoutOf(sec *int64) (time.Duration, error) {
	if sec == nil {
		return DefaultTimeout, nil
	}
	if *sec <= 0 || *sec > int64(MaxTimeout/time.Second) {
		return 0, badRequest("timeout %d s: want 1..%d", *sec, int64(MaxTimeout/time.Second))
	}
	return time.Duration(*sec) * time.Second, nil
}

// optionsOf maps a create body to box options.
func (s *Server) optionsOf(body newSandboxBody) (airlock.BoxOptions, string, error) {
	tmpl := body.TemplateID
	if tmpl == "" {
		tmpl = "base"
	}
	img, ok := s.templates[tmpl]
	if !ok {
		img = tmpl
	}
	ttl, err := timeoutOf(body.Timeout)
	if err != nil {
		return airlock.BoxOptions{}, "", err
	}
	o := airlock.BoxOptions{Image: img, TTL: ttl, Labels: map[string]string{templateLabel: tmpl}}
	for k, v := range body.Metadata {
		if strings.HasPrefix(k, labelPrefix) {
			return o, "", badRequest("metadata key %q: the prefix %s is airlock's own", k, labelPrefix)
		}
		if k == tenantLabel {
			return o, "", badRequest("metadata key %q is airlock's own (it names a box's tenant)", k)
		}
		o.Labels[k] = v
	}
	keys := make([]string, 0, len(body.EnvVars))
	for k := range body.EnvVars {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return o, "", badRequest("envVars key %q: want a variable name", k)
		}
		o.Env = append(o.Env, k+"="+body.EnvVars[k])
	}
	var e egress
	if body.Network != nil {
		e = *body.Network
		e.AllowInternetAccess = nil // not a field of a create's network
	}
	pol, err := policyOf(e, body.AllowInternetAccess != nil && !*body.AllowInternetAccess)
	o.Network, o.AllowNet, o.DenyNet = pol.mode, pol.allow, pol.deny
	if err != nil {
		return o, "", err
	}
	resume := body.AutoResume != nil && body.AutoResume.Enabled != nil && *body.AutoResume.Enabled
	if body.AutoPause != nil && *body.AutoPause {
		if body.AutoPauseMemory != nil && !*body.AutoPauseMemory {
			return o, "", badRequest("autoPauseMemory false (on_timeout mode filesystem): airlock pauses a sandbox with its memory")
		}
		// The timeout pauses the sandbox once it passes with no use:
		// airlock's idle suspend (BoxOptions.IdleAction), which a call
		// to the box also wakes from.
		o.TTL, o.IdleTimeout, o.IdleAction = 0, ttl, airlock.IdleSuspend
		o.Labels[onTimeoutLabel] = "pause"
		if resume {
			o.Labels[autoResumeLabel] = "true"
		}
	} else if resume {
		return o, "", badRequest("autoResume needs autoPause (on_timeout pause)")
	}
	if o.Volumes, err = volumesOf(body.VolumeMounts); err != nil {
		return o, "", err
	}
	if len(o.Volumes) > 0 && o.IdleAction == airlock.IdleSuspend {
		return o, "", badRequest("volumeMounts with autoPause: airlock cannot pause a sandbox with volumes (QEMU cannot save a mounted share)")
	}
	if set(body.MCP) {
		return o, "", badRequest("mcp servers in a sandbox are not supported by airlock's E2B API")
	}
	if set(body.IAM) {
		return o, "", badRequest("iam (workload identity tokens) is not supported by airlock's E2B API")
	}
	return o, tmpl, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var body newSandboxBody
	if err := s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	opts, tmpl, err := s.optionsOf(body)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	ctx := r.Context()
	check := &opts
	if _, named := s.templates[tmpl]; !named {
		// A template naming a snapshot of this home (create_snapshot's
		// id) restores it.
		sn, err := s.snapshotTemplate(ctx, tmpl)
		if err != nil {
			writeBoxError(w, err)
			return
		}
		if sn != nil {
			opts.Image, opts.FromSnapshot = "", sn.Name
			eff, err := s.rt.ResolveOptions(ctx, opts)
			if err != nil {
				writeBoxError(w, err)
				return
			}
			check = &eff // the policy sees the restored box's machine
		}
	}
	if s.cfg.CheckBox != nil {
		release, err := s.cfg.CheckBox(ctx, check)
		if err != nil {
			writeBoxError(w, err)
			return
		}
		defer release()
	}
	cctx := ctx
	if s.cfg.PullContext != nil {
		cctx = s.cfg.PullContext(ctx)
	}
	b, err := s.rt.Create(cctx, opts)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	sb := newSandbox(s, b)
	if _, err := sb.user(ctx, defaultUser); err != nil {
		// An image without sh and a writable /etc cannot have E2B's user.
		s.rt.Remove(context.WithoutCancel(ctx), b.ID(), true)
		writeError(w, http.StatusBadRequest, fmt.Sprintf("template %s (image %s): %v", tmpl, opts.Image, err))
		return
	}
	s.mu.Lock()
	s.boxes[b.ID()] = sb
	s.mu.Unlock()
	s.sweep(ctx)
	writeJSON(w, http.StatusCreated, s.createdOf(b.ID(), tmpl))
}

func (s *Server) createdOf(id, tmpl string) created {
	tok := s.accessToken(id)
	return created{TemplateID: tmpl, SandboxID: id, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: tok, TrafficAccessToken: tok}
}

// lookup returns the E2B sandbox id (a box made through this API).
func (s *Server) lookup(ctx context.Context, id string) (*airlock.Box, airlock.BoxInfo, error) {
	b, err := s.rt.Get(ctx, id)
	if err != nil {
		return nil, airlock.BoxInfo{}, fmt.Errorf("sandbox %s not found: %w", id, err)
	}
	info, err := b.Info(ctx)
	if err != nil {
		return nil, info, fmt.Errorf("sandbox %s not found: %w", id, err)
	}
	if _, ok := info.Options.Labels[templateLabel]; !ok {
		return nil, info, fmt.Errorf("sandbox %s not found: box %s was not made through the E2B API: %w", id, id, errNotSandbox)
	}
	return b, info, nil
}

// stateOf is E2B's state of a box: running, else paused (an airlock box
// that is stopped, paused or suspended continues on connect).
func stateOf(info airlock.BoxInfo) string {
	if info.State == airlock.BoxRunning {
		return "running"
	}
	return "paused"
}

func listedOf(info airlock.BoxInfo) listed {
	md := map[string]string{}
	for k, v := range info.Options.Labels {
		if !strings.HasPrefix(k, labelPrefix) {
			md[k] = v
		}
	}
	started := info.Started
	if started.IsZero() {
		started = info.Created
	}
	end := info.ExpiresAt
	if autoPauses(info.Options) {
		end = info.IdleDeadline
	}
	return listed{TemplateID: info.Options.Labels[templateLabel], SandboxID: info.ID, ClientID: clientID,
		StartedAt: started.UTC(), EndAt: end.UTC(), CPUCount: info.Options.CPUs, MemoryMB: info.Options.MemoryMiB,
		DiskSizeMB: info.Options.DiskSizeMiB, Metadata: md, State: stateOf(info), EnvdVersion: EnvdVersion}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	_, info, err := s.lookup(r.Context(), id)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	net := networkOf(info.Options)
	writeJSON(w, http.StatusOK, detail{listed: listedOf(info), EnvdAccessToken: s.accessToken(id),
		AllowInternetAccess: net == nil || len(net.AllowOut) > 0, Network: net, Lifecycle: lifecycleOf(info.Options),
		VolumeMounts: mountsOf(info.Options)})
}

// maxListLimit bounds a list page.
const maxListLimit = 1000

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var want map[string]string
	if md := q.Get("metadata"); md != "" {
		// The SDK sends the pairs URL-encoded twice: once as a query
		// string of their own, once as this parameter's value.
		vals, err := url.ParseQuery(md)
		if err != nil {
			writeBoxError(w, badRequest("metadata %q: want key=value pairs joined by &", md))
			return
		}
		want = map[string]string{}
		for k, v := range vals {
			k, _ = url.QueryUnescape(k)
			vv, _ := url.QueryUnescape(v[0])
			want[k] = vv
		}
	}
	states := map[string]bool{"running": true, "paused": true}
	if st := q.Get("state"); st != "" {
		states = map[string]bool{}
		for _, x := range strings.Split(st, ",") {
			if x != "running" && x != "paused" {
				writeBoxError(w, badRequest("state %q: want running or paused", x))
				return
			}
			states[x] = true
		}
	}
	tmpl := q.Get("template")
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListLimit {
			writeBoxError(w, badRequest("limit %q: want 1..%d", l, maxListLimit))
			return
		}
		limit = n
	}
	after := q.Get("nextToken")
	boxes, err := s.rt.List(r.Context())
	if err != nil {
		writeBoxError(w, err)
		return
	}
	if q.Get("order") == "desc" {
		slices.Reverse(boxes)
	}
	out := []listed{}
	skipping := after != ""
	next := ""
	for _, info := range boxes {
		t, ok := info.Options.Labels[templateLabel]
		if !ok || (tmpl != "" && t != tmpl) || !states[stateOf(info)] {
			continue
		}
		match := true
		for k, v := range want {
			if got, ok := info.Options.Labels[k]; !ok || got != v {
				match = false
			}
		}
		if !match {
			continue
		}
		if skipping {
			if info.ID == after {
				skipping = false
			}
			continue
		}
		if len(out) == limit {
			next = out[len(out)-1].SandboxID
			break
		}
		out = append(out, listedOf(info))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	b, _, err := s.lookup(r.Context(), id)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	s.forget(b.ID())
	if err := b.Remove(r.Context(), true); err != nil && !errors.Is(err, airlock.ErrBoxNotFound) {
		writeBoxError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	if body.Timeout == nil {
		writeBoxError(w, badRequest("timeout: required, in seconds"))
		return
	}
	ttl, err := timeoutOf(body.Timeout)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	b, info, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		writeBoxError(w, err)
		return
	}
	if err := setTimeout(r.Context(), b, info.Options, ttl); err != nil {
		writeBoxError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh (keep-alive) extends the timeout by its duration from now, when
// that is later than the current end.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Duration *int64 `json:"duration"`
	}
	if err := s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	ttl, err := timeoutOf(body.Duration)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	b, info, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		writeBoxError(w, err)
		return
	}
	end := info.ExpiresAt
	if autoPauses(info.Options) {
		end = info.IdleDeadline
	}
	if end.IsZero() || time.Now().Add(ttl).After(end) {
		if err := setTimeout(r.Context(), b, info.Options, ttl); err != nil {
			writeBoxError(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect returns a sandbox's connection details, starting (resuming) a
// box that is not running; a timeout given sets its TTL from now.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	ctx := r.Context()
	id := r.PathValue("id")
	b, info, err := s.lookup(ctx, id)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	var ttl time.Duration
	if body.Timeout != nil {
		if ttl, err = timeoutOf(body.Timeout); err != nil {
			writeBoxError(w, err)
			return
		}
	}
	status := http.StatusOK
	if info.State != airlock.BoxRunning || paused(ctx, b) {
		if s.cfg.CheckStart != nil {
			if err := s.cfg.CheckStart(ctx, b); err != nil {
				writeBoxError(w, err)
				return
			}
		}
		if autoPauses(info.Options) && ttl > 0 {
			// The new timeout first: the old one may be shorter than
			// the resume takes, and pause the box again at once.
			if err := setTimeout(ctx, b, info.Options, ttl); err != nil {
				writeBoxError(w, err)
				return
			}
		}
		if err := resume(ctx, b, info); err != nil {
			writeBoxError(w, err)
			return
		}
		status = http.StatusCreated
	}
	if ttl > 0 {
		if err := setTimeout(ctx, b, info.Options, ttl); err != nil {
			writeBoxError(w, err)
			return
		}
	}
	writeJSON(w, status, s.createdOf(id, info.Options.Labels[templateLabel]))
}

func paused(ctx context.Context, b *airlock.Box) bool {
	p, err := b.Paused(ctx)
	return err == nil && p
}

// resume makes a box run again: Resume for a paused or suspended one,
// Start for a stopped one.
func resume(ctx context.Context, b *airlock.Box, info airlock.BoxInfo) error {
	if info.State == airlock.BoxRunning || info.Suspended {
		return b.Resume(ctx)
	}
	return b.Start(ctx)
}

// sweep forgets the sandboxes whose boxes are gone (killed elsewhere, or
// reaped at their timeout), so that what the server keeps stays bounded
// by the boxes there are.
func (s *Server) sweep(ctx context.Context) {
	s.mu.Lock()
	boxes := make([]*sandbox, 0, len(s.boxes))
	for _, sb := range s.boxes {
		boxes = append(boxes, sb)
	}
	s.mu.Unlock()
	for _, sb := range boxes {
		if _, err := sb.box.Info(ctx); errors.Is(err, airlock.ErrBoxNotFound) {
			s.forget(sb.box.ID())
		}
	}
}

// pause suspends the box to disk (Box.Suspend: its memory and disk are
// kept, the VM ends); connect or resume continues it where it was. The
// sandbox's timeout goes on counting meanwhile.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	var body struct {
		KeepMemory *bool `json:"keepMemory"`
		Memory     *bool `json:"memory"`
	}
	if err := s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	if (body.KeepMemory != nil && !*body.KeepMemory) || (body.Memory != nil && !*body.Memory) {
		writeBoxError(w, badRequest("keepMemory false: airlock pauses a sandbox with its memory"))
		return
	}
	ctx := r.Context()
	b, info, err := s.lookup(ctx, r.PathValue("id"))
	if err != nil {
		writeBoxError(w, err)
		return
	}
	if info.State != airlock.BoxRunning {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is not running (state %s)", info.ID, info.State))
		return
	}
	if s.cfg.CheckSuspend != nil {
		if err := s.cfg.CheckSuspend(ctx, b); err != nil {
			writeBoxError(w, err)
			return
		}
	}
	// Its processes and contexts end with the VM's run.
	s.forget(b.ID())
	if err := b.Suspend(ctx); err != nil {
		writeBoxError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
