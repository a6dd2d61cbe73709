package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
)

// Snapshots and fork: E2B's create_snapshot, list_snapshots,
// delete_snapshot and fork, on airlock's memory snapshots (Box.Snapshot)
// and Box.Fork. A snapshot's id is the airlock snapshot's name; a create
// whose template names a snapshot restores it (BoxOptions.FromSnapshot).

// snapshotJSON is E2B's SnapshotInfo.
type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// forkResult is one entry of a fork's answer (E2B's SandboxForkResult):
// a sandbox, or why that child failed.
type forkResult struct {
	Sandbox *created  `json:"sandbox,omitempty"`
	Error   *apiError `json:"error,omitempty"`
}

// maxForkCount is the most children one fork asks: E2B's 20.
const maxForkCount = 20

// snapshotName checks a snapshot name a client gives, or makes one.
func snapshotName(name string) (string, error) {
	if name == "" {
		b := make([]byte, 6)
		rand.Read(b)
		return "e2b-snapshot-" + hex.EncodeToString(b), nil
	}
	if len(name) > 64 || !validSnapshotName(name) {
		return "", badRequest("snapshot name %q: airlock's snapshot names are 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (no team/ prefix or :tag)", name)
	}
	return name, nil
}

func validSnapshotName(s string) bool {
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return s != ""
}

// createSnapshot takes a memory snapshot of a running sandbox (it is
// paused while its state is written, then runs on).
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name   string `json:"name"`
		Memory *bool  `json:"memory"`
	}
	if err := s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	if body.Memory != nil && !*body.Memory {
		writeBoxError(w, badRequest(`mode "filesystem": airlock's snapshots keep the sandbox's memory and files ("full")`))
		return
	}
	name, err := snapshotName(body.Name)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	ctx := r.Context()
	b, info, err := s.lookup(ctx, r.PathValue("id"))
	if err != nil {
		writeBoxError(w, err)
		return
	}
	if info.State != airlock.BoxRunning {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is not running (state %s): connect to it first", info.ID, info.State))
		return
	}
	if s.cfg.CheckSnapshot != nil {
		release, err := s.cfg.CheckSnapshot(ctx, b)
		if err != nil {
			writeBoxError(w, err)
			return
		}
		defer release()
	}
	if _, err := b.Snapshot(ctx, name); err != nil {
		if errors.Is(err, airlock.ErrSnapshotExists) {
			writeError(w, http.StatusConflict, fmt.Sprintf("a snapshot named %s exists: delete it (Sandbox.delete_snapshot) or pick another name", name))
			return
		}
		writeBoxError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotJSON{SnapshotID: name, Names: []string{name}})
}

// listSnapshots lists the home's snapshots, oldest first, filtered by
// source sandbox (sandboxID) and name, in pages (limit, nextToken: the
// last snapshot of the page before).
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListLimit {
			writeBoxError(w, badRequest("limit %q: want 1..%d", l, maxListLimit))
			return
		}
		limit = n
	}
	all, err := s.rt.Snapshots(r.Context())
	if err != nil {
		writeBoxError(w, err)
		return
	}
	box, name, after := q.Get("sandboxID"), q.Get("name"), q.Get("nextToken")
	out := []snapshotJSON{}
	skipping := after != ""
	for _, sn := range all {
		if (box != "" && sn.Box != box) || (name != "" && sn.Name != name) {
			continue
		}
		if skipping {
			skipping = sn.Name != after
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", out[len(out)-1].SnapshotID)
			break
		}
		out = append(out, snapshotJSON{SnapshotID: sn.Name, Names: []string{sn.Name}})
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot answers E2B's DELETE /templates/{id} for a snapshot:
// the SDK's delete_snapshot. Templates that are images are not deleted
// (404).
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !validSnapshotName(id) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("snapshot %s not found", id))
		return
	}
	if err := s.rt.RemoveSnapshot(r.Context(), id); err != nil {
		if errors.Is(err, airlock.ErrSnapshotNotFound) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("snapshot %s not found (templates that are images are not deleted through the E2B API)", id))
			return
		}
		writeBoxError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fork forks a running sandbox into count new ones (Box.Fork: the box is
// paused while it is snapshotted, then runs on). Each child runs on from
// the same instant: its files, processes and memory; its Python code
// contexts are the parent's interpreters as they were (codebox's Fork).
// The children keep the parent's metadata and template; their timeout is
// the request's (default: what is left of the parent's).
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	n := 1
	if body.Count != nil {
		n = *body.Count
	}
	if n < 1 || n > maxForkCount {
		writeBoxError(w, badRequest("count %d: want 1..%d", n, maxForkCount))
		return
	}
	var ttl time.Duration
	if body.Timeout != nil {
		var err error
		if ttl, err = timeoutOf(body.Timeout); err != nil {
			writeBoxError(w, err)
			return
		}
	}
	ctx := r.Context()
	id := r.PathValue("id")
	b, info, err := s.lookup(ctx, id)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	if info.State != airlock.BoxRunning || paused(ctx, b) {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is not running (state %s): connect to it first", id, stateOf(info)))
		return
	}
	if s.cfg.CheckFork != nil {
		if err := s.cfg.CheckFork(ctx, b, n); err != nil {
			writeBoxError(w, err)
			return
		}
	}
	sb, err := s.sandbox(ctx, id)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	kids, err := sb.fork(ctx, n)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	tmpl := info.Options.Labels[templateLabel]
	out := make([]forkResult, len(kids))
	for i, k := range kids {
		if ttl > 0 {
			if err := k.box.SetTTL(ctx, ttl); err != nil {
				out[i] = forkResult{Error: &apiError{Code: statusOf(err), Message: err.Error()}}
				s.rt.Remove(context.WithoutCancel(ctx), k.box.ID(), true)
				k.close()
				continue
			}
		}
		s.mu.Lock()
		s.boxes[k.box.ID()] = k
		s.mu.Unlock()
		c := s.createdOf(k.box.ID(), tmpl)
		out[i] = forkResult{Sandbox: &c}
	}
	writeJSON(w, http.StatusCreated, out)
}

// fork forks the sandbox's box into n children, each a sandbox with the
// parent's users and, when the parent has a CodeBox, its Python contexts
// (under the same ids). The parent's processes and bash contexts are
// not the children's to follow: they run on in the children unattached.
func (sb *sandbox) fork(ctx context.Context, n int) ([]*sandbox, error) {
	sb.cmu.Lock()
	cb := sb.cb
	var pys []*codeContext
	for _, c := range sb.contexts {
		if c.language == "python" {
			pys = append(pys, c)
		}
	}
	sb.cmu.Unlock()
	var boxes []*airlock.Box
	var cbs []*codebox.CodeBox
	if cb != nil {
		var err error
		if cbs, err = cb.Fork(ctx, n); err != nil {
			return nil, err
		}
		for _, k := range cbs {
			boxes = append(boxes, k.Box())
		}
	} else {
		var err error
		if boxes, err = sb.box.Fork(ctx, n); err != nil {
			return nil, err
		}
	}
	sb.userOnce.Lock()
	users := make(map[string]userInfo, len(sb.users))
	for k, v := range sb.users {
		users[k] = v
	}
	sb.userOnce.Unlock()
	out := make([]*sandbox, len(boxes))
	for i, b := range boxes {
		k := newSandbox(sb.s, b)
		k.users = users
		if i > 0 {
			k.users = make(map[string]userInfo, len(users))
			for name, u := range users {
				k.users[name] = u
			}
		}
		if cbs != nil {
			k.cb = cbs[i]
			for _, c := range pys {
				c.mu.Lock()
				x, runs := c.x, c.runs
				c.mu.Unlock()
				if x == nil {
					continue
				}
				if kx := cbs[i].Context(x.ID()); kx != nil {
					k.contexts[c.id] = &codeContext{id: c.id, language: c.language, cwd: c.cwd, user: c.user, x: kx, runs: runs}
				}
			}
		}
		out[i] = k
	}
	return out, nil
}

// snapshotTemplate returns the options of a create whose template names
// a snapshot of this home (nil when it names none).
func (s *Server) snapshotTemplate(ctx context.Context, tmpl string) (*airlock.SnapshotInfo, error) {
	if !validSnapshotName(tmpl) || len(tmpl) > 64 || strings.Contains(tmpl, ":") {
		return nil, nil
	}
	info, err := s.rt.Snapshot(ctx, tmpl)
	if errors.Is(err, airlock.ErrSnapshotNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &info, nil
}
