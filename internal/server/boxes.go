package server

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/boxrecord"
)

// BoxSpec is the body of POST /v1/boxes: the airlock.BoxOptions fields a
// client may set.
type BoxSpec struct {
	Image          string            `json:"image,omitempty" doc:"Image reference (Docker syntax); pulled if not in the local store." default:"python:slim" maxLength:"512"`
	Name           string            `json:"name,omitempty" doc:"Optional unique name, usable wherever an id is." maxLength:"128"`
	CPUs           int               `json:"cpus,omitempty" doc:"vCPUs (default 1)." minimum:"0" maximum:"64"`
	MemoryMiB      int               `json:"memory_mib,omitempty" doc:"Guest RAM in MiB (default 512)." minimum:"0" maximum:"262144"`
	DiskSizeMiB    int               `json:"disk_size_mib,omitempty" doc:"Writable layer size in MiB (default 4096)." minimum:"0" maximum:"1048576"`
	Env            EnvList           `json:"env,omitempty" doc:"Variables added to the image's environment: [\"KEY=value\", ...] or {\"KEY\": \"value\"}."`
	WorkingDir     string            `json:"working_dir,omitempty" doc:"Working directory of every exec (default: the image's)." maxLength:"4096"`
	User           string            `json:"user,omitempty" doc:"User of every exec: name, uid, name:group or uid:gid." maxLength:"256"`
	Network        string            `json:"network,omitempty" doc:"public (default: the internet; the host, private and link-local ranges denied), allowlist (only allow_net; the default when allow_net is given) or none (no interface); enabled and disabled are old names of public and none." enum:"public,allowlist,none,enabled,disabled"`
	AllowNet       []string          `json:"allow_net,omitempty" maxItems:"256" doc:"Destinations of an allowlist network: names (api.example.com, *.example.com), IPs or CIDRs, each with an optional :PORT. IPs and CIDRs inside private ranges need airlock serve --allow-private-net."`
	AllowHostPorts []int             `json:"allow_host_ports,omitempty" maxItems:"64" doc:"Ports of the host's 127.0.0.1 the box may reach as host.airlock.internal:PORT; each must be granted by airlock serve --allow-host-port."`
	Volumes        []VolumeSpec      `json:"volumes,omitempty" maxItems:"32" doc:"Host directories (under a directory granted by airlock serve --allow-volume) and named volumes attached to the box."`
	Ports          []PortSpec        `json:"ports,omitempty" maxItems:"64" doc:"Published ports (Docker's -p): host address and port forwarded to a port in the box; each must be granted by airlock serve --allow-publish. Needs a network (not none)."`
	AutoRemove     bool              `json:"auto_remove,omitempty" doc:"Remove the box when it stops."`
	TTL            float64           `json:"ttl,omitempty" minimum:"0" doc:"Seconds: the box is removed this long after creating it (stored with the box: a server restart keeps it)."`
	IdleTimeout    float64           `json:"idle_timeout,omitempty" minimum:"0" doc:"Seconds: after this long with no exec, file or code call on it (nor, for idle_action stop and suspend, traffic on its network), idle_action is taken (stored with the box: a server restart keeps it)."`
	IdleAction     string            `json:"idle_action,omitempty" enum:"remove,stop,suspend" doc:"What idle_timeout does: remove (the default) the box, stop it, or suspend it (scale to zero: paused to disk, no host memory or CPU held, shown as suspended; the next exec, file, code or port call resumes it first, and a published TCP port stays bound: its first inbound connection wakes the box and is then served). Needs idle_timeout; suspend refuses volumes."`
	Lease          float64           `json:"lease,omitempty" minimum:"0" doc:"Seconds: the box is removed unless POST /v1/boxes/{id}/lease renews it within this time (the SDKs do, while their process lives; stored with the box: a server restart keeps it)."`
	Labels         map[string]string `json:"labels,omitempty" doc:"The caller's key/value pairs, stored with the box and matched by GET /v1/boxes?label=KEY=VALUE: at most 64, keys 1..128 bytes, values at most 1024, UTF-8 without control characters."`
	FromSnapshot   string            `json:"from_snapshot,omitempty" maxLength:"128" doc:"Restore this memory snapshot (POST /v1/boxes/{id}/snapshot) instead of booting: the box runs on from where the snapshot's box was, with its processes and files. Image, cpus, memory_mib, disk_size_mib and network come from the snapshot (leave them out, or give the snapshot's); env, working_dir, user, allow_net and allow_host_ports default to its box's (allow_net makes it an allowlist box); name, ports (never the snapshot box's) and the network policy are the request's, checked as for any create; volumes are refused."`

	// Secrets are the box's secrets by name (airlock.BoxOptions.Secrets).
	Secrets map[string]SecretSpec `json:"secrets,omitempty" doc:"Secrets the box uses but never sees, by environment variable name: in the box the variable holds a placeholder, which the server's network helper replaces by the value in the headers of HTTPS requests to the secret's hosts (only there: not over plain HTTP, not in URLs or bodies). A secret's hosts are allowed on port 443 under an allowlist. Values are never returned by any call. At most 32."`
}

// SecretSpec is one secret of a create (airlock.Secret).
type SecretSpec struct {
	Value string   `json:"value" doc:"The secret (1-8192 bytes, no control characters). Never echoed back."`
	Hosts []string `json:"hosts" minItems:"1" maxItems:"16" doc:"Hosts it is sent to: api.example.com, or *.example.com for any name below example.com."`
}

// SecretInfo is a box's secret as the API shows it: never its value.
type SecretInfo struct {
	Name  string   `json:"name"`
	Hosts []string `json:"hosts"`
}

// VolumeSpec attaches storage to a box (airlock.Volume).
type VolumeSpec struct {
	Source   string `json:"source" minLength:"1" maxLength:"4096" doc:"An absolute host directory (shared over 9p; it must be under a directory the server grants with --allow-volume, symlinks resolved) or a named volume (letters, digits, _ . -; created with 1 GiB when missing)."`
	Target   string `json:"target" minLength:"2" maxLength:"4096" doc:"Absolute mount point in the box (not /)."`
	ReadOnly bool   `json:"read_only,omitempty" doc:"Read-only, enforced on the host: not even root in the box can write."`
}

// Box is a box as the API shows it.
type Box struct {
	ID             string            `json:"id" doc:"Box id (12 hex digits)."`
	Name           string            `json:"name,omitempty"`
	Image          string            `json:"image"`
	ImageDigest    string            `json:"image_digest,omitempty"`
	State          string            `json:"state" enum:"created,running,stopped,lost" doc:"lost: the box's Kubernetes node stopped answering or is NotReady (airlock gateway); calls into it fail with box_lost, and the box is not recreated: remove it and create another."`
	Node           string            `json:"node,omitempty" doc:"The Kubernetes node that runs the box (airlock gateway); absent from airlock serve."`
	CPUs           int               `json:"cpus"`
	MemoryMiB      int               `json:"memory_mib"`
	DiskSizeMiB    int               `json:"disk_size_mib"`
	Network        string            `json:"network"`
	AutoRemove     bool              `json:"auto_remove"`
	AllowNet       []string          `json:"allow_net,omitempty"`
	AllowHostPorts []int             `json:"allow_host_ports,omitempty"`
	Volumes        []VolumeSpec      `json:"volumes,omitempty"`
	Secrets        []SecretInfo      `json:"secrets,omitempty" doc:"The box's secrets: names and hosts, never values."`
	Ports          []PortSpec        `json:"ports,omitempty" doc:"Published ports: while the box runs, as bound by its current start (a host_port 0 replaced by the port picked); otherwise as asked."`
	Created        time.Time         `json:"created"`
	Started        time.Time         `json:"started,omitzero"`
	Paused         bool              `json:"paused,omitempty" doc:"The running box's vCPUs are stopped (POST /v1/boxes/{id}/pause): execs, code runs and file calls into it are refused (409 box_paused) until it is resumed."`
	Unhealthy      string            `json:"unhealthy,omitempty" doc:"Why the running box was declared unhealthy (its agent did not report the end of a timed-out exec in time); it is killed if its agent then does not answer within 20 s. Absent when healthy."`
	Suspended      bool              `json:"suspended,omitempty" doc:"The stopped box was paused to disk (pause with to_disk, or by idle_action suspend): resume or start continues it from its saved memory; a box suspended by idle_action suspend also resumes by itself on its next exec, file, code or port call or inbound connection."`
	ExpiresAt      time.Time         `json:"expires_at,omitzero" doc:"When the box's ttl ends and it is removed (absent: no ttl)."`
	LeaseUntil     time.Time         `json:"lease_until,omitzero" doc:"When the box is removed unless its lease is renewed (absent: no lease)."`
	IdleDeadline   time.Time         `json:"idle_deadline,omitzero" doc:"When idle_action is taken on the box unless it is used before (absent: no idle_timeout). Use is recorded every few seconds, so this may lag a recent call by that much."`
	TTL            float64           `json:"ttl,omitempty" doc:"Seconds from creation after which the box is removed (absent: none); expires_at is when."`
	Lease          float64           `json:"lease,omitempty" doc:"Seconds a lease renewal keeps the box (absent: no lease); lease_until is when it runs out."`
	IdleTimeout    float64           `json:"idle_timeout,omitempty" doc:"Seconds without an exec, file or code call (nor, for idle_action stop and suspend, traffic on its network) after which idle_action is taken (absent: none)."`
	IdleAction     string            `json:"idle_action,omitempty" doc:"What idle_timeout does: remove, stop or suspend (absent: remove)."`
	Labels         map[string]string `json:"labels,omitempty"`
}

func boxOf(i airlock.BoxInfo) Box {
	b := Box{ID: i.ID, Name: i.Name, Image: i.Image, ImageDigest: i.ImageDigest, State: string(i.State),
		CPUs: i.Options.CPUs, MemoryMiB: i.Options.MemoryMiB, DiskSizeMiB: i.Options.DiskSizeMiB,
		Network: string(i.Options.Network), AutoRemove: i.Options.AutoRemove, Created: i.Created, Started: i.Started,
		AllowNet: i.Options.AllowNet, AllowHostPorts: i.Options.AllowHostPorts, Suspended: i.Suspended,
		ExpiresAt: i.ExpiresAt, LeaseUntil: i.LeaseUntil, IdleDeadline: i.IdleDeadline, TTL: i.Options.TTL.Seconds(), Lease: i.Options.Lease.Seconds(), IdleTimeout: i.Options.IdleTimeout.Seconds(), IdleAction: string(i.Options.IdleAction), Labels: i.Options.Labels}
	for _, v := range i.Options.Volumes {
		b.Volumes = append(b.Volumes, VolumeSpec{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	for _, n := range slices.Sorted(maps.Keys(i.Options.Secrets)) {
		b.Secrets = append(b.Secrets, SecretInfo{Name: n, Hosts: i.Options.Secrets[n].Hosts})
	}
	ports := i.Options.Ports
	if i.Ports != nil {
		ports = i.Ports // bound
	}
	for _, p := range ports {
		b.Ports = append(b.Ports, portSpecOf(p))
	}
	return b
}

// BoxList is the body of GET /v1/boxes.
type BoxList struct {
	Boxes []Box `json:"boxes"`
}

type boxOutput struct {
	Body Box
}

type boxIDInput struct {
	ID string `path:"id" doc:"Box id, unique id prefix, or name." maxLength:"128"`
}

// getBox returns the box id names (an id, unique id prefix, or name)
// among those the request's tenant sees: another tenant's box is 404,
// exactly as a box that does not exist.
func (s *Server) getBox(ctx context.Context, id string) (*airlock.Box, error) {
	if tenantOf(ctx) != nil {
		return s.tenantBox(ctx, id)
	}
	b, err := s.rt.Get(ctx, id)
	if err != nil {
		return nil, problem(err)
	}
	return b, nil
}

// callBox is getBox for a call into the box (an exec, a code run, a file
// operation): a box paused in memory is refused at once with box_paused,
// as docker refuses an exec into a paused container, where its agent would
// not answer until the box is resumed.
func (s *Server) callBox(ctx context.Context, id string) (*airlock.Box, error) {
	b, err := s.getBox(ctx, id)
	if err != nil {
		return nil, err
	}
	if paused, _ := b.Paused(ctx); paused { // false for a driver that cannot pause
		return nil, &Problem{Status: http.StatusConflict, Code: CodeBoxPaused,
			Detail: fmt.Sprintf("box %s is paused: resume it first (POST /v1/boxes/%s/resume, or airlock unpause %s)", b.ID(), b.ID(), b.ID())}
	}
	return b, nil
}

func (s *Server) boxOut(ctx context.Context, b *airlock.Box) (*boxOutput, error) {
	info, err := b.Info(ctx)
	if err != nil {
		return nil, problem(err)
	}
	s.noteOwner(info.ID, info.Options.Labels)
	out := &boxOutput{Body: view(ctx, boxOf(info))}
	if info.State == airlock.BoxRunning {
		out.Body.Paused, _ = b.Paused(ctx) // false for a driver that cannot pause
		out.Body.Unhealthy = b.Unhealthy()
	}
	return out, nil
}

// checkBoxSpec refuses what the schema cannot say of a create body and
// the library would refuse naming no field (a memory_mib under its
// minimum, a bad label, idle_action without idle_timeout): a 400 whose
// errors point at each bad field. What it lets through the library still
// checks.
func checkBoxSpec(sp BoxSpec) *Problem {
	var errs []*FieldError
	bad := func(pointer, msg string) {
		errs = append(errs, &FieldError{Pointer: pointer, Location: locationOf(pointer), Message: msg})
	}
	if sp.MemoryMiB != 0 && sp.MemoryMiB < airlock.MinMemoryMiB {
		bad("/memory_mib", fmt.Sprintf("%d MiB: want at least %d (or leave it out for the default)", sp.MemoryMiB, airlock.MinMemoryMiB))
	}
	if sp.DiskSizeMiB != 0 && sp.DiskSizeMiB < airlock.MinDiskSizeMiB {
		bad("/disk_size_mib", fmt.Sprintf("%d MiB: want at least %d (or leave it out for the default)", sp.DiskSizeMiB, airlock.MinDiskSizeMiB))
	}
	if sp.IdleAction != "" && sp.IdleTimeout == 0 {
		bad("/idle_action", "idle_action needs idle_timeout: set it too")
	}
	if len(sp.Labels) > boxrecord.MaxLabels {
		bad("/labels", fmt.Sprintf("%d labels: at most %d", len(sp.Labels), boxrecord.MaxLabels))
	} else {
		for _, k := range slices.Sorted(maps.Keys(sp.Labels)) {
			if err := boxrecord.CheckLabels(map[string]string{k: sp.Labels[k]}); err != nil {
				bad("/labels/"+escapePointer(k), err.Error())
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return &Problem{Status: http.StatusBadRequest, Title: http.StatusText(http.StatusBadRequest), Code: CodeInvalid,
		Detail: validationDetail(errs), Errors: errs}
}

var boxErrors = []int{http.StatusNotFound, http.StatusConflict, http.StatusBadGateway}

func (s *Server) registerBoxes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "create-box", Method: http.MethodPost, Path: "/v1/boxes", Tags: []string{"boxes"},
		Summary:       "Create a box",
		Description:   "Creates a box from an image (pulled if absent) and boots it, or restores it from a memory snapshot (from_snapshot): when the call returns, execs can run.",
		DefaultStatus: http.StatusCreated, Errors: []int{http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound, http.StatusConflict, http.StatusBadGateway, http.StatusServiceUnavailable},
	}, func(ctx context.Context, in *struct{ Body BoxSpec }) (*boxOutput, error) {
		sp := in.Body
		if p := checkBoxSpec(sp); p != nil {
			return nil, p
		}
		if s.cfg.Cluster != nil {
			return s.clusterCreate(ctx, sp)
		}
		opts := airlock.BoxOptions{Image: sp.Image, Name: sp.Name, CPUs: sp.CPUs, MemoryMiB: sp.MemoryMiB,
			DiskSizeMiB: sp.DiskSizeMiB, Env: sp.Env, WorkingDir: sp.WorkingDir, User: sp.User,
			AutoRemove: sp.AutoRemove, Network: airlock.NetworkMode(sp.Network), AllowNet: sp.AllowNet, AllowHostPorts: sp.AllowHostPorts,
			TTL: secs(sp.TTL), IdleTimeout: secs(sp.IdleTimeout), IdleAction: airlock.IdleAction(sp.IdleAction), Lease: secs(sp.Lease), Labels: sp.Labels}
		for _, v := range sp.Volumes {
			opts.Volumes = append(opts.Volumes, airlock.Volume{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly})
		}
		for _, p := range sp.Ports {
			opts.Ports = append(opts.Ports, airlock.PortMapping{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Protocol: p.Protocol})
		}
		if len(sp.Secrets) > airlock.MaxSecrets {
			return nil, invalidField("/secrets", fmt.Sprintf("%d secrets: at most %d", len(sp.Secrets), airlock.MaxSecrets))
		}
		for n, s := range sp.Secrets {
			if opts.Secrets == nil {
				opts.Secrets = map[string]airlock.Secret{}
			}
			opts.Secrets[n] = airlock.Secret{Value: s.Value, Hosts: s.Hosts}
		}
		if err := own(ctx, &opts); err != nil {
			return nil, err
		}
		var release func()
		var err error
		if sp.FromSnapshot != "" {
			if opts.Image == airlock.DefaultImage {
				opts.Image = "" // huma's default: the snapshot names its image
			}
			opts.FromSnapshot = ns(ctx, sp.FromSnapshot)
			release, err = s.checkRestore(ctx, opts)
		} else {
			release, err = s.checkCreate(ctx, &opts)
		}
		if err != nil {
			return nil, err
		}
		b, err := s.rt.Create(s.pullContext(ctx), opts)
		release()
		if err != nil {
			if len(opts.Ports) > 0 && strings.Contains(err.Error(), "address already in use") {
				return nil, &Problem{Status: http.StatusConflict, Title: http.StatusText(http.StatusConflict), Code: CodePortInUse,
					Detail: err.Error() + ": pick another host_port, or 0 for a free one"}
			}
			return nil, tenantProblem(ctx, err)
		}
		return s.boxOut(ctx, b)
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "list-boxes", Method: http.MethodGet, Path: "/v1/boxes", Tags: []string{"boxes"},
		Summary: "List boxes", Description: "Every box of this airlock home the caller sees (a tenant's token: its own boxes; airlock serve --tenants), oldest first; with label, those with all the labels named.",
		Errors: []int{http.StatusBadRequest},
	}, func(ctx context.Context, in *struct {
		Label []string `query:"label,explode" maxItems:"64" doc:"KEY=VALUE: only boxes with this label; KEY alone: with this key. Repeatable: all must match."`
	}) (*struct{ Body BoxList }, error) {
		match, err := labelFilter(in.Label)
		if err != nil {
			return nil, err
		}
		out := &struct{ Body BoxList }{}
		if s.cfg.Cluster != nil {
			boxes, err := s.cfg.Cluster.ListBoxes(ctx)
			if err != nil {
				return nil, clusterProblem(err)
			}
			out.Body.Boxes = make([]Box, 0, len(boxes))
			for _, b := range boxes {
				if sees(ctx, b.Labels) && match(b.Labels) {
					out.Body.Boxes = append(out.Body.Boxes, view(ctx, b))
				}
			}
			return out, nil
		}
		infos, err := s.rt.List(ctx)
		if err != nil {
			return nil, problem(err)
		}
		out.Body.Boxes = make([]Box, 0, len(infos))
		for _, i := range infos {
			if !sees(ctx, i.Options.Labels) || !match(i.Options.Labels) {
				continue
			}
			out.Body.Boxes = append(out.Body.Boxes, view(ctx, boxOf(i)))
		}
		s.cfg.Metrics.boxStates(infos)
		return out, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "get-box", Method: http.MethodGet, Path: "/v1/boxes/{id}", Tags: []string{"boxes"},
		Summary: "Get a box", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *boxIDInput) (*boxOutput, error) {
		if s.cfg.Cluster != nil {
			b, err := s.cfg.Cluster.GetBox(ctx, in.ID)
			if err != nil {
				return nil, clusterProblem(err)
			}
			if !sees(ctx, b.Labels) { // the Cluster scopes it already
				return nil, &Problem{Status: http.StatusNotFound, Title: "Not Found", Code: CodeBoxNotFound, Detail: fmt.Sprintf("no box %q", in.ID)}
			}
			return &boxOutput{Body: view(ctx, b)}, nil
		}
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		return s.boxOut(ctx, b)
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "start-box", Method: http.MethodPost, Path: "/v1/boxes/{id}/start", Tags: []string{"boxes"},
		Summary: "Start a box", Description: "Boots the box's VM if it is not running and waits for its agent.",
		Errors: append([]int{http.StatusForbidden, http.StatusServiceUnavailable}, boxErrors...),
	}, func(ctx context.Context, in *boxIDInput) (*boxOutput, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		release, err := s.checkStart(ctx, b)
		if err != nil {
			return nil, err
		}
		defer release()
		if err := b.Start(ctx); err != nil {
			return nil, problem(err)
		}
		return s.boxOut(ctx, b)
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "stop-box", Method: http.MethodPost, Path: "/v1/boxes/{id}/stop", Tags: []string{"boxes"},
		Summary: "Stop a box", Description: "Shuts the box down (an auto_remove box is then removed: 404 on later calls).",
		Errors: boxErrors,
	}, func(ctx context.Context, in *boxIDInput) (*boxOutput, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		s.dropCodebox(b.ID())
		info, _ := b.Info(ctx)
		if err := b.Stop(ctx); err != nil {
			return nil, problem(err)
		}
		if out, err := s.boxOut(ctx, b); err == nil {
			return out, nil
		}
		info.State = airlock.BoxStopped // removed on stop
		return &boxOutput{Body: view(ctx, boxOf(info))}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "remove-box", Method: http.MethodDelete, Path: "/v1/boxes/{id}", Tags: []string{"boxes"},
		Summary: "Remove a box", Description: "Deletes the box (VM, writable layer, record). A running box needs force=true.",
		DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *struct {
		ID    string `path:"id" maxLength:"128"`
		Force bool   `query:"force" doc:"Kill a running box's VM."`
	}) (*struct{}, error) {
		if s.cfg.Cluster != nil {
			return nil, clusterProblem(s.cfg.Cluster.RemoveBox(ctx, in.ID, in.Force))
		}
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		s.dropCodebox(b.ID())
		if err := b.Remove(ctx, in.Force); err != nil {
			return nil, problem(err)
		}
		return nil, nil
	})
}
