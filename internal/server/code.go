package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/headtail"
)

// codeState is the server's CodeBox for one box and its contexts.
type codeState struct {
	cb *codebox.CodeBox

	mu       sync.Mutex
	contexts map[string]*codebox.Context
}

func (s *Server) codeboxFor(b *airlock.Box) *codeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs, ok := s.codeboxes[b.ID()]
	if !ok {
		cs = &codeState{cb: codebox.Attach(b, codebox.Options{MaxOutput: s.cfg.MaxOutputBytes}), contexts: map[string]*codebox.Context{}}
		s.codeboxes[b.ID()] = cs
	}
	return cs
}

// dropCodebox closes the contexts of a box being stopped or removed.
func (s *Server) dropCodebox(id string) {
	s.mu.Lock()
	cs := s.codeboxes[id]
	delete(s.codeboxes, id)
	s.mu.Unlock()
	if cs != nil {
		cs.cb.Close()
	}
}

func (s *Server) closeCodeboxes() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.codeboxes))
	for id := range s.codeboxes {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.dropCodebox(id)
	}
}

// RunRequest is the body of code run and context run calls.
type RunRequest struct {
	Code    string  `json:"code" doc:"Python source."`
	Timeout float64 `json:"timeout,omitempty" minimum:"0" doc:"Seconds; enforced: the Python process tree (or the cell) is interrupted past it. 0: none."`
}

// RunResult is the result of POST /v1/boxes/{id}/code/run: python -c code
// in a fresh interpreter.
type RunResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr" doc:"The traceback, when the code raised."`
	ExitCode int    `json:"exit_code"`
	TimedOut bool   `json:"timed_out"`
	Error    string `json:"error,omitempty" doc:"What went wrong, when exit_code is not 0 or the run timed out."`
	// Truncated is set when output was cut: past the box's output bound
	// (a marker line in stdout or stderr says where) or past the
	// server's --max-output.
	Truncated     bool    `json:"truncated" doc:"Output was cut; a marker line in stdout or stderr says where and how much."`
	StdoutDropped int64   `json:"stdout_dropped,omitempty" doc:"Bytes of stdout left out in the box (past its output bound)."`
	StderrDropped int64   `json:"stderr_dropped,omitempty" doc:"Bytes of stderr left out in the box (past its output bound)."`
	Duration      float64 `json:"duration_ms"`
}

// InstallRequest is the body of POST /v1/boxes/{id}/code/install.
type InstallRequest struct {
	Packages []string `json:"packages" minItems:"1" maxItems:"256" doc:"pip requirements (\"requests\", \"numpy==1.26.4\")."`
	IndexURL string   `json:"index_url,omitempty" maxLength:"2048" doc:"pip --index-url (default PyPI)."`
}

// InstallResult is pip's output.
type InstallResult struct {
	Output   string `json:"output" doc:"pip's stdout followed by its stderr."`
	ExitCode int    `json:"exit_code"`
}

// CellResult is the result of one context cell.
type CellResult struct {
	Stdout    string      `json:"stdout"`
	Stderr    string      `json:"stderr"`
	Value     string      `json:"value,omitempty" doc:"repr() of the last expression, when not None."`
	Error     *CellError  `json:"error,omitempty" doc:"Set when the cell raised."`
	Images    []CellImage `json:"images,omitempty" doc:"matplotlib figures left open, as PNG."`
	TimedOut  bool        `json:"timed_out"`
	StateLost bool        `json:"state_lost" doc:"The interpreter was restarted: earlier variables are gone."`
	Truncated bool        `json:"truncated" doc:"Output was cut; a marker line in stdout or stderr says where and how much."`
	// StdoutDropped and StderrDropped count what the box left out.
	StdoutDropped int64   `json:"stdout_dropped,omitempty" doc:"Characters of stdout left out in the box (bytes for output written to the file descriptor)."`
	StderrDropped int64   `json:"stderr_dropped,omitempty" doc:"Characters of stderr left out in the box (bytes for output written to the file descriptor)."`
	Duration      float64 `json:"duration_ms"`
}

// CellError is an exception raised by a cell.
type CellError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// CellImage is an image output; huma encodes []byte as base64.
type CellImage struct {
	MIMEType string `json:"mime" doc:"image/png"`
	Data     []byte `json:"data" doc:"base64"`
}

// ContextInfo names a context.
type ContextInfo struct {
	ID string `json:"id" doc:"Context id."`
}

type contextPath struct {
	ID  string `path:"id" maxLength:"128"`
	Ctx string `path:"ctx" maxLength:"64"`
}

func withTimeout(ctx context.Context, secs float64) (context.Context, context.CancelFunc) {
	d := seconds(secs)
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// clipText cuts s so that its JSON encoding fits in max bytes: its head
// and tail are kept, with a note between them saying how many bytes were
// left out. clipped says whether it cut.
func clipText(s string, max int64) (_ string, clipped bool) {
	const room = 160 // the note
	head, tail, dropped := headtail.ClipText(s, int(max-room))
	if dropped == 0 {
		return s, false
	}
	return head + fmt.Sprintf("\n[airlock serve: %d bytes left out here: past %d bytes of JSON (--max-output)]\n", dropped, max) + tail, true
}

// textLimit is what one output field of a code run, cell or install may
// take in a response: twice the stream limit, as for a buffered exec.
func (s *Server) textLimit() int64 { return 2 * s.cfg.MaxOutputBytes }

// clipRun bounds the text of a code run's result (clipText).
func (s *Server) clipRun(r *RunResult) {
	var c [3]bool
	r.Stdout, c[0] = clipText(r.Stdout, s.textLimit())
	r.Stderr, c[1] = clipText(r.Stderr, s.textLimit())
	r.Error, c[2] = clipText(r.Error, s.textLimit()/4)
	r.Truncated = r.Truncated || c[0] || c[1] || c[2]
}

// clipCell bounds the text of a cell's result (clipText); Truncated is set
// when it cut.
func (s *Server) clipCell(r *CellResult) {
	var c [5]bool
	r.Stdout, c[0] = clipText(r.Stdout, s.textLimit())
	r.Stderr, c[1] = clipText(r.Stderr, s.textLimit())
	r.Value, c[2] = clipText(r.Value, s.textLimit()/4)
	if e := r.Error; e != nil {
		e.Name, _ = clipText(e.Name, 4<<10)
		e.Value, c[3] = clipText(e.Value, s.textLimit()/4)
		e.Traceback, c[4] = clipText(e.Traceback, s.textLimit()/4)
	}
	r.Truncated = r.Truncated || c[0] || c[1] || c[2] || c[3] || c[4]
}

func newContextID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) registerCode() {
	errs := []int{http.StatusNotFound, http.StatusConflict, http.StatusTooManyRequests, http.StatusBadGateway}
	huma.Register(s.api, huma.Operation{
		OperationID: "code-run", Method: http.MethodPost, Path: "/v1/boxes/{id}/code/run", Tags: []string{"code"},
		Summary:     "Run Python code (python -c) in a fresh interpreter",
		Description: "The timeout is enforced (the Python process tree is killed) and a failure is reported in exit_code, stderr and error.",
		Errors:      errs,
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128"`
		Body RunRequest
	}) (*struct{ Body RunResult }, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		release, err := s.acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
		cs := s.codeboxFor(b)
		rctx, cancel := withTimeout(ctx, in.Body.Timeout)
		defer cancel()
		t0 := time.Now()
		out, err := cs.cb.RunOutput(rctx, in.Body.Code)
		res := RunResult{Stdout: out.Stdout, Truncated: out.Truncated, StdoutDropped: out.StdoutDropped, StderrDropped: out.StderrDropped,
			Duration: ms(time.Since(t0))}
		var ee *codebox.ExecError
		switch {
		case errors.As(err, &ee):
			res.Stderr, res.ExitCode, res.TimedOut, res.Error = ee.Stderr, ee.ExitCode, ee.TimedOut, ee.Error()
		case err != nil:
			s.audit(ctx, AuditEntry{Kind: "code_run", BoxID: b.ID(), Code: in.Body.Code}, t0, err)
			return nil, problem(err)
		}
		s.audit(ctx, AuditEntry{Kind: "code_run", BoxID: b.ID(), Code: in.Body.Code, ExitCode: intp(res.ExitCode), TimedOut: res.TimedOut}, t0, nil)
		s.clipRun(&res)
		return &struct{ Body RunResult }{res}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "code-install", Method: http.MethodPost, Path: "/v1/boxes/{id}/code/install", Tags: []string{"code"},
		Summary: "pip install packages in the box", Errors: errs,
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128"`
		Body InstallRequest
	}) (*struct{ Body InstallResult }, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		release, err := s.acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
		cb := codebox.Attach(b, codebox.Options{IndexURL: in.Body.IndexURL, MaxOutput: s.cfg.MaxOutputBytes})
		t0 := time.Now()
		out, err := cb.InstallPackages(ctx, in.Body.Packages...)
		res := InstallResult{Output: out}
		var ee *codebox.ExecError
		ae := AuditEntry{Kind: "install", BoxID: b.ID(), Cmd: append([]string{"pip", "install"}, in.Body.Packages...)}
		switch {
		case errors.As(err, &ee):
			res.ExitCode = ee.ExitCode
		case err != nil:
			s.audit(ctx, ae, t0, err)
			return nil, problem(err)
		}
		ae.ExitCode = intp(res.ExitCode)
		s.audit(ctx, ae, t0, nil)
		res.Output, _ = clipText(res.Output, s.textLimit())
		return &struct{ Body InstallResult }{res}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "create-context", Method: http.MethodPost, Path: "/v1/boxes/{id}/contexts", Tags: []string{"code"},
		Summary:       "Start a stateful Python context",
		Description:   "A long-lived interpreter: variables, imports and functions persist between cells. It ends when deleted, or when the box stops or the server exits.",
		DefaultStatus: http.StatusCreated, Errors: errs,
	}, func(ctx context.Context, in *boxIDInput) (*struct{ Body ContextInfo }, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		cs := s.codeboxFor(b)
		x, err := cs.cb.NewContext(ctx)
		if err != nil {
			return nil, problem(err)
		}
		id := newContextID()
		cs.mu.Lock()
		cs.contexts[id] = x
		cs.mu.Unlock()
		return &struct{ Body ContextInfo }{ContextInfo{ID: id}}, nil
	})

	lookup := func(ctx context.Context, p contextPath) (*codeState, *codebox.Context, error) {
		b, err := s.getBox(ctx, p.ID)
		if err != nil {
			return nil, nil, err
		}
		cs := s.codeboxFor(b)
		cs.mu.Lock()
		x := cs.contexts[p.Ctx]
		cs.mu.Unlock()
		if x == nil {
			return nil, nil, &Problem{Status: http.StatusNotFound, Code: CodeContextNotFound,
				Detail: "box " + b.ID() + " has no context " + p.Ctx + " (create one with POST /v1/boxes/{id}/contexts)"}
		}
		return cs, x, nil
	}

	huma.Register(s.api, huma.Operation{
		OperationID: "run-cell", Method: http.MethodPost, Path: "/v1/boxes/{id}/contexts/{ctx}/run", Tags: []string{"code"},
		Summary: "Run a cell in a context", Errors: errs,
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128"`
		Ctx  string `path:"ctx" maxLength:"64"`
		Body RunRequest
	}) (*struct{ Body CellResult }, error) {
		cs, x, err := lookup(ctx, contextPath{ID: in.ID, Ctx: in.Ctx})
		if err != nil {
			return nil, err
		}
		release, err := s.acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
		rctx, cancel := withTimeout(ctx, in.Body.Timeout)
		defer cancel()
		t0 := time.Now()
		r, err := x.Run(rctx, in.Body.Code)
		ae := AuditEntry{Kind: "cell", BoxID: cs.cb.Box().ID(), Code: in.Body.Code}
		if r != nil {
			ae.TimedOut = r.TimedOut
			if r.Error != nil {
				ae.Error = r.Error.Name + ": " + r.Error.Value
			}
		}
		s.audit(ctx, ae, t0, err)
		if r == nil {
			return nil, problem(err)
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return nil, problem(err)
		}
		out := CellResult{Stdout: r.Stdout, Stderr: r.Stderr, Value: r.Value, TimedOut: r.TimedOut || err != nil,
			StateLost: r.StateLost, Truncated: r.Truncated, StdoutDropped: r.StdoutDropped, StderrDropped: r.StderrDropped, Duration: ms(r.Duration)}
		if r.Error != nil {
			out.Error = &CellError{Name: r.Error.Name, Value: r.Error.Value, Traceback: r.Error.Traceback}
		}
		for _, im := range r.Images {
			out.Images = append(out.Images, CellImage{MIMEType: im.MIMEType, Data: im.Data})
		}
		s.clipCell(&out)
		return &struct{ Body CellResult }{out}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "delete-context", Method: http.MethodDelete, Path: "/v1/boxes/{id}/contexts/{ctx}", Tags: []string{"code"},
		Summary: "End a context", DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *contextPath) (*struct{}, error) {
		cs, x, err := lookup(ctx, *in)
		if err != nil {
			return nil, err
		}
		cs.mu.Lock()
		delete(cs.contexts, in.Ctx)
		cs.mu.Unlock()
		x.Close()
		return nil, nil
	})
}
