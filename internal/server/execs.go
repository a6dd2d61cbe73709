package server

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
)

// ExecInfo describes an exec in progress (GET /v1/boxes/{id}/execs).
type ExecInfo struct {
	ID      string    `json:"id" doc:"Exec id, for DELETE /v1/boxes/{id}/execs/{exec}."`
	BoxID   string    `json:"box_id"`
	Kind    string    `json:"kind" enum:"exec,exec_stream"`
	Cmd     []string  `json:"cmd"`
	Started time.Time `json:"started"`
	Client  string    `json:"client"`
}

// ExecList is the body of GET /v1/boxes/{id}/execs.
type ExecList struct {
	Execs []ExecInfo `json:"execs"`
}

type execEntry struct {
	info ExecInfo
	p    *airlock.Process
}

// register records a running exec; the returned func forgets it.
func (s *Server) register(ctx context.Context, kind, boxID string, cmd []string, p *airlock.Process) (string, func()) {
	id := newContextID()
	e := &execEntry{info: ExecInfo{ID: id, BoxID: boxID, Kind: kind, Cmd: cmd, Started: time.Now().UTC(), Client: clientOf(ctx)}, p: p}
	s.mu.Lock()
	s.execs[id] = e
	s.mu.Unlock()
	return id, func() {
		s.mu.Lock()
		delete(s.execs, id)
		s.mu.Unlock()
	}
}

func (s *Server) registerExecs() {
	huma.Register(s.api, huma.Operation{
		OperationID: "list-execs", Method: http.MethodGet, Path: "/v1/boxes/{id}/execs", Tags: []string{"exec"},
		Summary: "List the execs running in a box (through this server)", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *boxIDInput) (*struct{ Body ExecList }, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		out := &struct{ Body ExecList }{ExecList{Execs: []ExecInfo{}}}
		s.mu.Lock()
		for _, e := range s.execs {
			if e.info.BoxID == b.ID() {
				out.Body.Execs = append(out.Body.Execs, e.info)
			}
		}
		s.mu.Unlock()
		sort.Slice(out.Body.Execs, func(i, j int) bool { return out.Body.Execs[i].Started.Before(out.Body.Execs[j].Started) })
		return out, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "kill-exec", Method: http.MethodDelete, Path: "/v1/boxes/{id}/execs/{exec}", Tags: []string{"exec"},
		Summary:       "Kill a running exec",
		Description:   "Kills the exec's process tree (SIGTERM, then SIGKILL after a grace); its caller gets the result (exit status 128 + the signal).",
		DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128"`
		Exec string `path:"exec" maxLength:"64"`
	}) (*struct{}, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		e := s.execs[in.Exec]
		s.mu.Unlock()
		if e == nil || e.info.BoxID != b.ID() {
			return nil, &Problem{Status: http.StatusNotFound, Title: "Not Found", Code: CodeExecNotFound,
				Detail: "no exec " + in.Exec + " is running in box " + b.ID() + " (GET /v1/boxes/{id}/execs lists them)"}
		}
		if err := e.p.Kill(); err != nil {
			return nil, problem(err)
		}
		return nil, nil
	})
}
