package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
)

// SnapshotRequest is the body of POST /v1/boxes/{id}/snapshot.
type SnapshotRequest struct {
	Name string `json:"name" minLength:"1" maxLength:"128" pattern:"^[A-Za-z0-9][A-Za-z0-9_.-]*$" doc:"The snapshot's name (letters, digits, _ . -; unique in the airlock home)."`
}

// Snapshot is a memory snapshot as the API shows it (airlock.SnapshotInfo).
type Snapshot struct {
	Name        string            `json:"name"`
	Box         string            `json:"box" doc:"Id of the box it was taken of."`
	BoxName     string            `json:"box_name,omitempty"`
	Image       string            `json:"image"`
	ImageDigest string            `json:"image_digest"`
	CPUs        int               `json:"cpus"`
	MemoryMiB   int               `json:"memory_mib"`
	DiskSizeMiB int               `json:"disk_size_mib"`
	Network     string            `json:"network"`
	Created     time.Time         `json:"created"`
	StateBytes  int64             `json:"state_bytes" doc:"Memory and device state on disk, bytes."`
	DiskBytes   int64             `json:"disk_bytes" doc:"The writable layer's copy, bytes allocated."`
	PausedMs    float64           `json:"paused_ms" doc:"How long the box was stopped while the snapshot was taken, ms."`
	Labels      map[string]string `json:"labels,omitempty" doc:"The labels its box had when it was taken."`
	Node        string            `json:"node,omitempty" doc:"The Kubernetes node that holds it (airlock gateway): restores and fork children run there; absent from airlock serve."`
}

func snapshotOf(i airlock.SnapshotInfo) Snapshot {
	return Snapshot{Name: i.Name, Box: i.Box, BoxName: i.BoxName, Image: i.Image, ImageDigest: i.ImageDigest,
		CPUs: i.Options.CPUs, MemoryMiB: i.Options.MemoryMiB, DiskSizeMiB: i.Options.DiskSizeMiB, Network: string(i.Options.Network),
		Created: i.Created, StateBytes: i.StateBytes, DiskBytes: i.DiskBytes, PausedMs: float64(i.Paused.Microseconds()) / 1000,
		Labels: i.Options.Labels}
}

// SnapshotList is the body of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// ForkRequest is the body of POST /v1/boxes/{id}/fork.
type ForkRequest struct {
	N int `json:"n,omitempty" minimum:"0" maximum:"64" doc:"How many children (default 1, at most 64)."`
	// FromCheckpoint is ForkOptions.FromCheckpoint.
	FromCheckpoint string `json:"from_checkpoint,omitempty" maxLength:"64" doc:"Start the children from the box's checkpoint of this name (POST /v1/boxes/{id}/checkpoints), any node of its tree, instead of from the box as it is now; the box is left alone and need not run. The children have no contexts (start new ones)."`
}

// ForkResult is the body of a fork's answer.
type ForkResult struct {
	Boxes []Box `json:"boxes" doc:"The children, running."`
}

// PauseRequest is the body of POST /v1/boxes/{id}/pause.
type PauseRequest struct {
	ToDisk bool `json:"to_disk,omitempty" doc:"Save the box's memory and devices into its directory and end its VM (no host memory or CPU held; the box shows as stopped and suspended), instead of stopping its vCPUs in memory. It ends the box's contexts and execs in progress (their processes run on in the box)."`
}

type snapshotNameInput struct {
	Name string `path:"name" maxLength:"128" doc:"Snapshot name."`
}

// reserveSnapshot refuses a snapshot of box info past
// Policy.MaxSnapshots or Policy.MinFreeDiskMiB (counting the box's memory
// and disk in full) and counts it as taken until release is called, so
// that concurrent snapshots cannot pass the cap together.
func (s *Server) reserveSnapshot(ctx context.Context, info airlock.BoxInfo) (release func(), err error) {
	c := &s.caps
	c.mu.Lock()
	defer c.mu.Unlock()
	if max := s.cfg.Policy.MaxSnapshots; max > 0 {
		list, err := s.rt.Snapshots(ctx)
		if err != nil {
			return nil, problem(err)
		}
		if n := len(list) + c.snapshots; n >= max {
			return nil, denied("%d snapshots exist or are being taken; this server keeps at most %d (airlock serve --max-snapshots): remove one first (DELETE /v1/snapshots/{name})", n, max)
		}
	}
	o := info.Options
	if err := s.checkFreeDisk(ctx, fmt.Sprintf("a snapshot of a box with %d MiB of memory and a disk of %d MiB", o.MemoryMiB, o.DiskSizeMiB),
		int64(o.MemoryMiB)+int64(o.DiskSizeMiB)); err != nil {
		return nil, err
	}
	c.snapshots++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			c.snapshots--
			c.mu.Unlock()
		})
	}, nil
}

// checkFork refuses a fork of box info into n boxes past Policy.MaxBoxes
// or Policy.MinFreeDiskMiB (counting the fork's own snapshot and the n
// children's disks in full).
func (s *Server) checkFork(ctx context.Context, info airlock.BoxInfo, n int) error {
	if err := s.checkBoxRoom(ctx, n, "a fork into %d boxes with %d not stopped would pass this server's limit of %d (airlock serve --max-boxes): remove boxes first, or fork into fewer"); err != nil {
		return err
	}
	o := info.Options
	return s.checkFreeDisk(ctx, fmt.Sprintf("a fork into %d boxes of a box with %d MiB of memory and a disk of %d MiB", n, o.MemoryMiB, o.DiskSizeMiB),
		int64(o.MemoryMiB)+int64(n+1)*int64(o.DiskSizeMiB))
}

// checkRestore checks a create from a snapshot as a create of the box
// the restore would make (airlock.Runtime.ResolveOptions): the snapshot's
// machine with the request's network policy and published ports.
func (s *Server) checkRestore(ctx context.Context, opts airlock.BoxOptions) (release func(), err error) {
	eff, err := s.rt.ResolveOptions(ctx, opts)
	if err != nil {
		return nil, tenantProblem(ctx, err)
	}
	return s.checkCreate(ctx, &eff)
}

// fork forks box b into n children; a box with contexts is forked as a
// CodeBox, so that each child has them under the same ids.
func (s *Server) fork(ctx context.Context, b *airlock.Box, n int, from string) ([]*airlock.Box, error) {
	if from != "" {
		return b.Fork(ctx, n, airlock.ForkOptions{FromCheckpoint: from})
	}
	s.mu.Lock()
	cs := s.codeboxes[b.ID()]
	s.mu.Unlock()
	if cs == nil {
		return b.Fork(ctx, n)
	}
	cs.mu.Lock()
	ids := make(map[string]string, len(cs.contexts)) // codebox id -> API id
	for id, x := range cs.contexts {
		ids[x.ID()] = id
	}
	cs.mu.Unlock()
	kids, err := cs.cb.Fork(ctx, n)
	if err != nil {
		return nil, err
	}
	out := make([]*airlock.Box, len(kids))
	for i, k := range kids {
		kcs := &codeState{cb: k, contexts: map[string]*codebox.Context{}}
		for cid, id := range ids {
			if x := k.Context(cid); x != nil {
				kcs.contexts[id] = x
			}
		}
		s.mu.Lock()
		s.codeboxes[k.Box().ID()] = kcs
		s.mu.Unlock()
		out[i] = k.Box()
	}
	return out, nil
}

// The errors of the snapshot and fork calls, and of pause and resume.
var (
	snapshotErrors = []int{http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound, http.StatusConflict, http.StatusNotImplemented, http.StatusBadGateway}
	pauseErrors    = []int{http.StatusNotFound, http.StatusConflict, http.StatusNotImplemented, http.StatusBadGateway}
)

func (s *Server) registerSnapshots() {
	huma.Register(s.api, huma.Operation{
		OperationID: "snapshot-box", Method: http.MethodPost, Path: "/v1/boxes/{id}/snapshot", Tags: []string{"snapshots"},
		Summary: "Snapshot a running box",
		Description: "Saves the box's memory, device state and writable layer, taken at one paused instant; the box runs on " +
			"(like docker commit, unlike docker checkpoint). POST /v1/boxes with from_snapshot starts boxes from it. " +
			"A box with volumes cannot be snapshotted.",
		DefaultStatus: http.StatusCreated,
		Errors:        snapshotErrors,
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128" doc:"Box id, unique id prefix, or name."`
		Body SnapshotRequest
	}) (*struct{ Body Snapshot }, error) {
		if cs, ok := s.cfg.Cluster.(ClusterSnapshots); ok {
			releaseTenant, err := s.reserveTenantSnapshot(ctx)
			if err != nil {
				return nil, err
			}
			defer releaseTenant()
			sn, err := cs.SnapshotBox(ctx, in.ID, ns(ctx, in.Body.Name))
			if err != nil {
				return nil, tenantProblem(ctx, clusterProblem(err))
			}
			return &struct{ Body Snapshot }{viewSnapshot(ctx, sn)}, nil
		}
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		bi, err := b.Info(ctx)
		if err != nil {
			return nil, problem(err)
		}
		releaseTenant, err := s.reserveTenantSnapshot(ctx)
		if err != nil {
			return nil, err
		}
		defer releaseTenant()
		release, err := s.reserveSnapshot(ctx, bi)
		if err != nil {
			return nil, err
		}
		info, err := b.Snapshot(ctx, ns(ctx, in.Body.Name))
		release()
		if err != nil {
			return nil, tenantProblem(ctx, err)
		}
		return &struct{ Body Snapshot }{viewSnapshot(ctx, snapshotOf(info))}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "fork-box", Method: http.MethodPost, Path: "/v1/boxes/{id}/fork", Tags: []string{"snapshots"},
		Summary: "Fork a running box",
		Description: "Pauses the box briefly, snapshots it and starts n children from that instant (or, with from_checkpoint, " +
			"from one of the box's checkpoints): each an independent box " +
			"with its own writable layer, the same processes and files, and, for a box with contexts, the same contexts " +
			"(same ids, variables kept). Children get the box's lease and idle timeout and what is left of its TTL; " +
			"they publish no ports. On error no child is left.",
		DefaultStatus: http.StatusCreated,
		Errors:        snapshotErrors,
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128" doc:"Box id, unique id prefix, or name."`
		Body ForkRequest
	}) (*struct{ Body ForkResult }, error) {
		n := max(in.Body.N, 1)
		if cs, ok := s.cfg.Cluster.(ClusterSnapshots); ok {
			kids, err := s.clusterFork(ctx, cs, in.ID, n, in.Body.FromCheckpoint)
			if err != nil {
				return nil, err
			}
			out := &struct{ Body ForkResult }{}
			out.Body.Boxes = make([]Box, 0, len(kids))
			for _, k := range kids {
				out.Body.Boxes = append(out.Body.Boxes, view(ctx, k))
			}
			return out, nil
		}
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		bi, err := b.Info(ctx)
		if err != nil {
			return nil, problem(err)
		}
		if err := s.checkFork(ctx, bi, n); err != nil {
			return nil, err
		}
		releaseQuota, err := s.reserveQuota(ctx, usageOfOptions(bi.Options, n), fmt.Sprintf("a fork into %d boxes", n))
		if err != nil {
			return nil, err
		}
		defer releaseQuota()
		kids, err := s.fork(ctx, b, n, in.Body.FromCheckpoint)
		if err != nil {
			return nil, problem(err)
		}
		out := &struct{ Body ForkResult }{}
		out.Body.Boxes = make([]Box, 0, len(kids))
		for _, k := range kids {
			info, err := k.Info(ctx)
			if err != nil {
				return nil, problem(err)
			}
			s.noteOwner(info.ID, info.Options.Labels)
			out.Body.Boxes = append(out.Body.Boxes, view(ctx, boxOf(info)))
		}
		return out, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "pause-box", Method: http.MethodPost, Path: "/v1/boxes/{id}/pause", Tags: []string{"snapshots"},
		Summary: "Pause a running box",
		Description: "Stops the box's vCPUs (no guest CPU; its memory stays allocated; execs, code runs and file calls into it are refused with 409 box_paused), or with to_disk " +
			"saves it to disk and ends its VM. POST /v1/boxes/{id}/resume lets it run on, with its clock stepped to the host's.",
		Errors: append([]int{http.StatusForbidden}, pauseErrors...),
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128" doc:"Box id, unique id prefix, or name."`
		Body PauseRequest
	}) (*boxOutput, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		if in.Body.ToDisk {
			// Its memory and device state go into its directory.
			info, err := b.Info(ctx)
			if err != nil {
				return nil, problem(err)
			}
			mem := int64(info.Options.MemoryMiB)
			if err := s.checkFreeDisk(ctx, fmt.Sprintf("pausing to disk a box with %d MiB of memory", mem), mem); err != nil {
				return nil, err
			}
			s.dropCodebox(b.ID())
			err = b.Suspend(ctx)
		} else {
			err = b.Pause(ctx)
		}
		if err != nil {
			return nil, problem(err)
		}
		return s.boxOut(ctx, b)
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "resume-box", Method: http.MethodPost, Path: "/v1/boxes/{id}/resume", Tags: []string{"snapshots"},
		Summary:     "Resume a paused box",
		Description: "Lets a paused box run on, or continues one paused to disk from its saved memory (same id, files and processes). A running box is left as it is.",
		Errors:      append([]int{http.StatusForbidden, http.StatusServiceUnavailable}, pauseErrors...),
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
		if err := b.Resume(ctx); err != nil {
			return nil, problem(err)
		}
		return s.boxOut(ctx, b)
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "list-snapshots", Method: http.MethodGet, Path: "/v1/snapshots", Tags: []string{"snapshots"},
		Summary: "List snapshots", Description: "Every memory snapshot of this airlock home the caller sees (a tenant's token: its own), oldest first.",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body SnapshotList }, error) {
		list, err := s.snapshots(ctx)
		if err != nil {
			return nil, err
		}
		out := &struct{ Body SnapshotList }{}
		out.Body.Snapshots = make([]Snapshot, 0, len(list))
		for _, sn := range list {
			if ownsSnapshot(ctx, sn.Name) {
				out.Body.Snapshots = append(out.Body.Snapshots, viewSnapshot(ctx, sn))
			}
		}
		return out, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "get-snapshot", Method: http.MethodGet, Path: "/v1/snapshots/{name}", Tags: []string{"snapshots"},
		Summary: "Get a snapshot", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *snapshotNameInput) (*struct{ Body Snapshot }, error) {
		if cs, ok := s.cfg.Cluster.(ClusterSnapshots); ok {
			sn, err := cs.Snapshot(ctx, ns(ctx, in.Name))
			if err != nil {
				return nil, tenantProblem(ctx, clusterProblem(err))
			}
			return &struct{ Body Snapshot }{viewSnapshot(ctx, sn)}, nil
		}
		info, err := s.rt.Snapshot(ctx, ns(ctx, in.Name))
		if err != nil {
			return nil, tenantProblem(ctx, err)
		}
		return &struct{ Body Snapshot }{viewSnapshot(ctx, snapshotOf(info))}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "remove-snapshot", Method: http.MethodDelete, Path: "/v1/snapshots/{name}", Tags: []string{"snapshots"},
		Summary: "Remove a snapshot", Description: "Boxes restored from it keep running: each has its own copy of what it needs.",
		DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *snapshotNameInput) (*struct{}, error) {
		if cs, ok := s.cfg.Cluster.(ClusterSnapshots); ok {
			return nil, tenantProblem(ctx, clusterProblem(cs.RemoveSnapshot(ctx, ns(ctx, in.Name))))
		}
		if err := s.rt.RemoveSnapshot(ctx, ns(ctx, in.Name)); err != nil {
			return nil, tenantProblem(ctx, err)
		}
		return nil, nil
	})
}

// snapshots lists every snapshot of the home, or of the Cluster.
func (s *Server) snapshots(ctx context.Context) ([]Snapshot, error) {
	if cs, ok := s.cfg.Cluster.(ClusterSnapshots); ok {
		list, err := cs.Snapshots(ctx)
		return list, clusterProblem(err)
	}
	list, err := s.rt.Snapshots(ctx)
	if err != nil {
		return nil, problem(err)
	}
	out := make([]Snapshot, len(list))
	for i, sn := range list {
		out[i] = snapshotOf(sn)
	}
	return out, nil
}

// clusterFork forks a Cluster's box: a tenant's children are admitted one
// by one against its quotas, each as a box of the parent's size.
func (s *Server) clusterFork(ctx context.Context, cs ClusterSnapshots, id string, n int, from string) ([]Box, error) {
	t := tenantOf(ctx)
	if t == nil {
		kids, err := cs.ForkBox(ctx, id, n, from, nil)
		return kids, clusterProblem(err)
	}
	parent, err := s.cfg.Cluster.GetBox(ctx, id)
	if err != nil {
		return nil, clusterProblem(err)
	}
	one := usageOfOptions(airlock.BoxOptions{CPUs: parent.CPUs, MemoryMiB: parent.MemoryMiB, DiskSizeMiB: parent.DiskSizeMiB}, 1)
	all := usageOfOptions(airlock.BoxOptions{CPUs: parent.CPUs, MemoryMiB: parent.MemoryMiB, DiskSizeMiB: parent.DiskSizeMiB}, n)
	what := fmt.Sprintf("a fork into %d boxes", n)
	release, err := s.reserveQuota(ctx, all, what)
	if err != nil {
		return nil, err
	}
	defer release()
	admit := func(boxes []Box) error {
		have := clusterUsage(boxes, t.Name)
		have.add(one, -1) // the new child is among them
		return checkQuota(t, s.quotaOf(t), have, one, what)
	}
	kids, err := cs.ForkBox(ctx, id, n, from, admit)
	if err != nil {
		return nil, tenantProblem(ctx, clusterProblem(err))
	}
	return kids, nil
}
