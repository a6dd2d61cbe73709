package server

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
)

// CheckpointRequest is the body of POST /v1/boxes/{id}/checkpoints and of
// POST /v1/boxes/{id}/rollback.
type CheckpointRequest struct {
	Name string `json:"name" minLength:"1" maxLength:"64" pattern:"^[A-Za-z0-9][A-Za-z0-9_.-]*$" doc:"The checkpoint's name (letters, digits, _ . -; unique in the box)."`
}

// Checkpoint is a box's checkpoint as the API shows it
// (airlock.CheckpointInfo).
type Checkpoint struct {
	Name       string    `json:"name"`
	Parent     string    `json:"parent,omitempty" doc:"The checkpoint the box was at when this one was taken (the last one taken or rolled back to); absent for a root."`
	Current    bool      `json:"current,omitempty" doc:"The box was last checkpointed at or rolled back to this one."`
	Created    time.Time `json:"created"`
	StateBytes int64     `json:"state_bytes" doc:"Memory and device state on disk, bytes."`
	DiskBytes  int64     `json:"disk_bytes" doc:"The writable layer's copy, bytes allocated."`
	PausedMs   float64   `json:"paused_ms" doc:"How long the box was stopped while the checkpoint was taken, ms."`
}

func checkpointOf(c airlock.CheckpointInfo) Checkpoint {
	return Checkpoint{Name: c.Name, Parent: c.Parent, Current: c.Current, Created: c.Created,
		StateBytes: c.StateBytes, DiskBytes: c.DiskBytes, PausedMs: float64(c.Paused.Microseconds()) / 1000}
}

// CheckpointList is the body of GET /v1/boxes/{id}/checkpoints.
type CheckpointList struct {
	Checkpoints []Checkpoint `json:"checkpoints" doc:"Oldest first."`
}

// checkCheckpointDisk refuses a checkpoint of box info past
// Policy.MinFreeDiskMiB, counting the box's memory and disk in full.
func (s *Server) checkCheckpointDisk(ctx context.Context, info airlock.BoxInfo) error {
	o := info.Options
	return s.checkFreeDisk(ctx, fmt.Sprintf("a checkpoint of a box with %d MiB of memory and a disk of %d MiB", o.MemoryMiB, o.DiskSizeMiB),
		int64(o.MemoryMiB)+int64(o.DiskSizeMiB))
}

func (s *Server) registerCheckpoints() {
	huma.Register(s.api, huma.Operation{
		OperationID: "checkpoint-box", Method: http.MethodPost, Path: "/v1/boxes/{id}/checkpoints", Tags: []string{"checkpoints"},
		Summary: "Checkpoint a running box",
		Description: "Saves the box's memory, devices and writable layer, at one paused instant, as a checkpoint of the box " +
			"(kept with it, removed with it); the box runs on. POST /v1/boxes/{id}/rollback returns the box to it in place. " +
			"Its parent is the checkpoint the box was last checkpointed at or rolled back to. A box with volumes cannot be checkpointed.",
		DefaultStatus: http.StatusCreated,
		Errors:        snapshotErrors,
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128" doc:"Box id, unique id prefix, or name."`
		Body CheckpointRequest
	}) (*struct{ Body Checkpoint }, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		bi, err := b.Info(ctx)
		if err != nil {
			return nil, problem(err)
		}
		if err := s.checkCheckpointDisk(ctx, bi); err != nil {
			return nil, err
		}
		// Checkpoints count in the tenant's disk quota by what they
		// take, known once taken: refused once the quota is reached.
		releaseQuota, err := s.reserveQuota(ctx, tenantUsage{diskMiB: 1}, "a checkpoint")
		if err != nil {
			return nil, err
		}
		defer releaseQuota()
		c, err := b.Checkpoint(ctx, in.Body.Name)
		if err != nil {
			return nil, problem(err)
		}
		return &struct{ Body Checkpoint }{checkpointOf(c)}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "list-checkpoints", Method: http.MethodGet, Path: "/v1/boxes/{id}/checkpoints", Tags: []string{"checkpoints"},
		Summary: "List a box's checkpoints", Description: "Oldest first; each names its parent, so they form a tree.",
		Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *boxIDInput) (*struct{ Body CheckpointList }, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		list, err := b.Checkpoints()
		if err != nil {
			return nil, problem(err)
		}
		out := &struct{ Body CheckpointList }{}
		out.Body.Checkpoints = make([]Checkpoint, 0, len(list))
		for _, c := range list {
			out.Body.Checkpoints = append(out.Body.Checkpoints, checkpointOf(c))
		}
		return out, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "remove-checkpoint", Method: http.MethodDelete, Path: "/v1/boxes/{id}/checkpoints/{name}", Tags: []string{"checkpoints"},
		Summary:       "Remove a checkpoint",
		Description:   "Safe for the checkpoints taken after it (each holds all a rollback needs): those whose parent it was get its parent.",
		DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128" doc:"Box id, unique id prefix, or name."`
		Name string `path:"name" maxLength:"64" doc:"Checkpoint name."`
	}) (*struct{}, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		if err := b.RemoveCheckpoint(ctx, in.Name); err != nil {
			return nil, problem(err)
		}
		return nil, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "rollback-box", Method: http.MethodPost, Path: "/v1/boxes/{id}/rollback", Tags: []string{"checkpoints"},
		Summary: "Roll a box back to a checkpoint",
		Description: "Returns the box, in place, to its checkpoint: processes, files and memory as they were then; the guest's " +
			"clock stepped to now and its RNG reseeded. The box keeps its id, name, published ports, network policy and secrets. " +
			"Execs running in it end with rolled_back. Its contexts keep their ids, with their interpreters (variables, imports) as at the checkpoint; " +
			"one made after the checkpoint starts a fresh interpreter at its next run. A stopped box is started at the checkpoint.",
		Errors: append([]int{http.StatusForbidden, http.StatusServiceUnavailable}, pauseErrors...),
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128" doc:"Box id, unique id prefix, or name."`
		Body CheckpointRequest
	}) (*boxOutput, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		release, err := s.checkStart(ctx, b)
		if err != nil {
			return nil, err
		}
		defer release()
		// A box with contexts is rolled back as a CodeBox: each context
		// gets its interpreter as it was at the checkpoint.
		s.mu.Lock()
		cs := s.codeboxes[b.ID()]
		s.mu.Unlock()
		if cs != nil {
			err = cs.cb.Rollback(ctx, in.Body.Name)
		} else {
			err = b.Rollback(ctx, in.Body.Name)
		}
		if err != nil {
			return nil, problem(err)
		}
		return s.boxOut(ctx, b)
	})
}
