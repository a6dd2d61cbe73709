package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/validation"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Stable problem codes (Problem.Code). Clients branch on these, not on the
// detail text.
const (
	CodeBoxNotFound     = "box_not_found"
	CodeImageNotFound   = "image_not_found"
	CodeContextNotFound = "context_not_found"
	CodeBoxNotRunning   = "box_not_running"
	CodeBoxRunning      = "box_running"
	CodeNameInUse       = "name_in_use"
	CodeBoxDied         = "box_died"
	CodeTimeout         = "timeout"
	CodeCanceled        = "canceled"
	CodeTooManyExecs    = "too_many_execs"
	CodeUnauthorized    = "unauthorized"
	CodeBodyTooLarge    = "body_too_large"
	CodeInvalid         = "invalid_request"
	CodeNotFound        = "not_found"
	CodeInternal        = "internal"
	CodePolicyDenied    = "policy_denied"
	CodeNoLease         = "no_lease"
	CodeExecNotFound    = "exec_not_found"
	CodePortInUse       = "port_in_use"
	// CodeSnapshotNotFound: no snapshot has that name (404).
	CodeSnapshotNotFound = "snapshot_not_found"
	// CodeSnapshotExists: a snapshot of that name exists (409).
	CodeSnapshotExists = "snapshot_exists"
	// CodeCheckpointNotFound: the box has no checkpoint of that name (404).
	CodeCheckpointNotFound = "checkpoint_not_found"
	// CodeCheckpointExists: the box has a checkpoint of that name (409).
	CodeCheckpointExists = "checkpoint_exists"
	// CodeRolledBack: the call's box was rolled back to a checkpoint
	// while it ran (409); what it did is gone with the state it ran in.
	CodeRolledBack = "rolled_back"
	// CodeNotSupported: the server's VM driver cannot do that (501).
	CodeNotSupported = "not_supported"
	// CodeHostCapacity: the box would pass a host-wide cap on running
	// boxes or their memory (airlock.CapacityError; 503): retry once
	// boxes have stopped, or ask for less memory.
	CodeHostCapacity = "host_capacity"
	// CodeTooManySubscribers: the server's event streams are all taken
	// (503; airlock serve --max-subscribers).
	CodeTooManySubscribers = "too_many_subscribers"
	// CodeBoxPaused: a call into a box paused in memory (409): resume it
	// first.
	CodeBoxPaused = "box_paused"
	// CodeMethodNotAllowed: the path exists, not with that method (405;
	// the Allow header lists the methods it takes).
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeQuotaExceeded: the request would take its tenant past one of
	// its quotas (403; airlock tenant add --max-...; tenants.go).
	CodeQuotaExceeded = "quota_exceeded"
)

// Problem is an RFC 9457 problem details object with airlock's stable
// code and, for a box whose VM died, the cause.
type Problem struct {
	Type     string        `json:"type,omitempty" doc:"A URI reference for the problem type (about:blank)."`
	Title    string        `json:"title,omitempty" doc:"Short summary of the problem type (the HTTP status text)."`
	Status   int           `json:"status,omitempty" doc:"HTTP status code."`
	Detail   string        `json:"detail,omitempty" doc:"What happened in this occurrence, and what to do."`
	Instance string        `json:"instance,omitempty" doc:"The request id of this occurrence."`
	Code     string        `json:"code" enum:"box_not_found,image_not_found,context_not_found,box_not_running,box_running,name_in_use,box_died,timeout,canceled,too_many_execs,unauthorized,body_too_large,invalid_request,not_found,internal,policy_denied,no_lease,exec_not_found,file_not_found,not_a_directory,is_a_directory,file_exists,permission_denied,read_only_filesystem,no_space,invalid_path,not_a_regular_file,port_in_use,snapshot_not_found,snapshot_exists,not_supported,host_capacity,too_many_subscribers,method_not_allowed,box_paused,quota_exceeded,checkpoint_not_found,checkpoint_exists,rolled_back,box_lost,unschedulable" doc:"Stable machine-readable code."`
	Cause    string        `json:"cause,omitempty" doc:"For box_died: why the VM ended (guest kernel panic, QEMU process exited, ...)."`
	Errors   []*FieldError `json:"errors,omitempty" doc:"For invalid_request (400): each bad field of the request, with where it is and what is wrong with it."`
}

func (p *Problem) Error() string { return p.Detail }

// GetStatus implements huma.StatusError.
func (p *Problem) GetStatus() int { return p.Status }

// ContentType makes huma send application/problem+json. huma asks it
// just before it writes p, so a Title left empty is filled in here (the
// status text), as writeProblem does outside huma.
func (p *Problem) ContentType(ct string) string {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	if ct == "application/json" {
		return "application/problem+json"
	}
	return ct
}

// FieldError is one bad field of a request (Problem.Errors). A field of
// the JSON body has a Pointer; a query, path or header parameter has a
// Parameter (and Location says which kind). Location is set for both.
// The value sent is never echoed: it may be a secret's.
type FieldError struct {
	Pointer   string `json:"pointer,omitempty" doc:"RFC 6901 JSON pointer to the bad value in the request body: /memory_mib, /env/0, /volumes/1/target. Absent for a parameter, and for a body that is not JSON at all (location body)."`
	Parameter string `json:"parameter,omitempty" doc:"The query, path or header parameter at fault, by name (location says which kind: query.label)."`
	Location  string `json:"location,omitempty" doc:"Where, in dotted form: body.env[0], query.label, path.id; body alone: the body as a whole."`
	Message   string `json:"message" doc:"What is wrong with it."`
}

// invalidField is a 400 invalid_request about the body field at pointer
// (RFC 6901: /ports/0/host_ip): detail is what is wrong and what to send.
func invalidField(pointer, detail string) *Problem {
	return &Problem{Status: http.StatusBadRequest, Title: http.StatusText(http.StatusBadRequest), Code: CodeInvalid, Detail: detail,
		Errors: []*FieldError{{Pointer: pointer, Location: locationOf(pointer), Message: detail}}}
}

// invalidParam is a 400 invalid_request about the parameter name in in
// ("query", "path", "header").
func invalidParam(in, name, detail string) *Problem {
	return &Problem{Status: http.StatusBadRequest, Title: http.StatusText(http.StatusBadRequest), Code: CodeInvalid, Detail: detail,
		Errors: []*FieldError{{Parameter: name, Location: in + "." + name, Message: detail}}}
}

func init() {
	huma.NewError = newError
}

// newError is huma's error constructor: a Problem. A request that fails
// validation is 400 invalid_request (huma's 422 and 400 alike: one status
// for "fix the request"), each error naming its field by a JSON pointer.
func newError(status int, msg string, errs ...error) huma.StatusError {
	if status == http.StatusUnprocessableEntity {
		status = http.StatusBadRequest
	}
	p := &Problem{Status: status, Title: http.StatusText(status), Detail: msg, Code: codeForStatus(status)}
	for _, e := range errs {
		if e == nil {
			continue
		}
		var d huma.ErrorDetailer
		if errors.As(e, &d) {
			p.Errors = append(p.Errors, fieldErrors(d.ErrorDetail())...)
		} else {
			p.Errors = append(p.Errors, &FieldError{Message: e.Error()})
		}
	}
	if status == http.StatusBadRequest && msg == "validation failed" && len(p.Errors) > 0 {
		p.Detail = validationDetail(p.Errors)
	}
	return p
}

// validationDetail names the bad fields in the detail, for clients that
// show only it: "validation failed: /memory_mib: expected number >= 0".
func validationDetail(errs []*FieldError) string {
	var b strings.Builder
	b.WriteString("validation failed")
	for i, e := range errs {
		if i == 4 {
			fmt.Fprintf(&b, "; and %d more (see errors)", len(errs)-i)
			break
		}
		sep := "; "
		if i == 0 {
			sep = ": "
		}
		where := e.Pointer
		if where == "" {
			where = e.Location
		}
		if where == "" {
			fmt.Fprintf(&b, "%s%s", sep, e.Message)
		} else {
			fmt.Fprintf(&b, "%s%s: %s", sep, where, e.Message)
		}
	}
	return b.String()
}

// fieldErrors turns one of huma's validation errors into airlock's: its
// dotted location (body.volumes[0].target, query.label) becomes a JSON
// pointer or a parameter name, and its value is dropped (the client sent
// it, and it may be a secret's, an env value or a file's bytes). An env
// that is neither a list of strings nor an object of strings is explained
// entry by entry (huma says only that it matched neither form).
func fieldErrors(d *huma.ErrorDetail) []*FieldError {
	fe := &FieldError{Location: d.Location, Message: d.Message}
	in, rest, _ := strings.Cut(d.Location, ".")
	switch in {
	case "body":
		if d.Location == "body" {
			if key, ok := envKeyOf(d.Message); ok {
				// EnvList.UnmarshalJSON's refusal of an object key.
				fe.Pointer = "/env/" + escapePointer(key)
				fe.Location = "body.env." + key
			}
			break
		}
		fe.Pointer = pointerOf(rest)
		if d.Message == validation.MsgExpectedMatchExactlyOneSchema && strings.HasSuffix(fe.Pointer, "/env") {
			if errs := envErrors(fe.Pointer, d.Location, d.Value); len(errs) > 0 {
				return errs
			}
		}
	case "query", "path", "header", "cookie":
		fe.Parameter = rest
	}
	return []*FieldError{fe}
}

// leafMaps are the body's objects whose keys are the caller's (labels):
// a key may hold '.' or '[', so the rest of a dotted location past them is
// one key, not a path.
var leafMaps = map[string]bool{"labels": true}

// pointerOf is the RFC 6901 pointer of huma's dotted path below body
// (volumes[0].target -> /volumes/0/target).
func pointerOf(dotted string) string {
	var b strings.Builder
	for dotted != "" {
		i := strings.IndexAny(dotted, ".[")
		tok := dotted
		if i >= 0 {
			tok = dotted[:i]
		}
		if tok != "" {
			b.WriteString("/" + escapePointer(tok))
			if leafMaps[tok] && i >= 0 && dotted[i] == '.' {
				b.WriteString("/" + escapePointer(dotted[i+1:]))
				return b.String()
			}
		}
		if i < 0 {
			break
		}
		if dotted[i] == '[' {
			j := strings.IndexByte(dotted[i:], ']')
			if j < 0 {
				b.WriteString("/" + escapePointer(dotted[i+1:]))
				break
			}
			b.WriteString("/" + dotted[i+1:i+j])
			dotted = strings.TrimPrefix(dotted[i+j+1:], ".")
			continue
		}
		dotted = dotted[i+1:]
	}
	return b.String()
}

// locationOf is the dotted location of a body pointer (the inverse of
// pointerOf, for the errors the handlers make).
func locationOf(pointer string) string {
	var b strings.Builder
	b.WriteString("body")
	for _, tok := range strings.Split(pointer, "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		if _, err := strconv.Atoi(tok); err == nil {
			b.WriteString("[" + tok + "]")
		} else {
			b.WriteString("." + tok)
		}
	}
	return b.String()
}

// escapePointer escapes a reference token of a JSON pointer (RFC 6901 §3).
func escapePointer(tok string) string {
	return strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1")
}

// documentBadRequest is an OnAddOperation hook: huma documents its
// validation failures as 422, which newError answers as 400; the
// operation's 400 says so, and an operation that takes parameters or a
// body documents 400 even when its handler adds none of its own.
func documentBadRequest(_ *huma.OpenAPI, op *huma.Operation) {
	const desc = "Bad Request: the request is invalid (invalid_request); errors names each bad field by JSON pointer (body) or parameter."
	r422 := op.Responses["422"]
	delete(op.Responses, "422")
	if r, ok := op.Responses["400"]; ok {
		r.Description = desc
		return
	}
	if r422 == nil && len(op.Parameters) == 0 && op.RequestBody == nil {
		return
	}
	if r422 == nil {
		r422 = &huma.Response{Content: map[string]*huma.MediaType{
			"application/problem+json": {Schema: &huma.Schema{Ref: "#/components/schemas/Problem"}}}}
	}
	r422.Description = desc
	if op.Responses == nil {
		op.Responses = map[string]*huma.Response{}
	}
	op.Responses["400"] = r422
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusMethodNotAllowed:
		return CodeMethodNotAllowed
	case http.StatusUnauthorized:
		return CodeUnauthorized
	case http.StatusRequestEntityTooLarge:
		return CodeBodyTooLarge
	case http.StatusTooManyRequests:
		return CodeTooManyExecs
	case http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusUnsupportedMediaType:
		return CodeInvalid
	}
	return CodeInternal
}

// problem maps a library error to a Problem by its sentinel.
func problem(err error) error {
	if err == nil {
		return nil
	}
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	mk := func(status int, code string) *Problem {
		return &Problem{Status: status, Title: http.StatusText(status), Code: code, Detail: err.Error()}
	}
	var died *airlock.DiedError
	var mbe *http.MaxBytesError
	var ce *airlock.CapacityError
	switch {
	case errors.As(err, &ce):
		return mk(http.StatusServiceUnavailable, CodeHostCapacity)
	case errors.As(err, &died):
		p := mk(http.StatusBadGateway, CodeBoxDied)
		p.Cause = died.Cause
		return p
	case errors.Is(err, airlock.ErrBoxDied):
		return mk(http.StatusBadGateway, CodeBoxDied)
	case errors.Is(err, airlock.ErrBoxNotFound):
		return mk(http.StatusNotFound, CodeBoxNotFound)
	case errors.Is(err, airlock.ErrImageNotFound):
		return mk(http.StatusNotFound, CodeImageNotFound)
	case errors.Is(err, airlock.ErrBoxNotRunning):
		return mk(http.StatusConflict, CodeBoxNotRunning)
	case errors.Is(err, airlock.ErrBoxPaused): // paused between callBox's check and the call
		return mk(http.StatusConflict, CodeBoxPaused)
	case errors.Is(err, airlock.ErrBoxRunning):
		return mk(http.StatusConflict, CodeBoxRunning)
	case errors.Is(err, airlock.ErrNameInUse):
		return mk(http.StatusConflict, CodeNameInUse)
	case errors.Is(err, airlock.ErrSnapshotNotFound):
		p := mk(http.StatusNotFound, CodeSnapshotNotFound)
		p.Detail += " (GET /v1/snapshots lists them)"
		return p
	case errors.Is(err, airlock.ErrSnapshotExists):
		return mk(http.StatusConflict, CodeSnapshotExists)
	case errors.Is(err, airlock.ErrCheckpointNotFound):
		p := mk(http.StatusNotFound, CodeCheckpointNotFound)
		p.Detail += " (GET /v1/boxes/{id}/checkpoints lists them)"
		return p
	case errors.Is(err, airlock.ErrCheckpointExists):
		return mk(http.StatusConflict, CodeCheckpointExists)
	case errors.Is(err, airlock.ErrRolledBack):
		return mk(http.StatusConflict, CodeRolledBack)
	case errors.Is(err, vmm.ErrNotSupported):
		p := mk(http.StatusNotImplemented, CodeNotSupported)
		p.Detail += ": this server's VM driver cannot do that"
		return p
	case errors.Is(err, airlock.ErrInvalidArgument):
		return mk(http.StatusBadRequest, CodeInvalid)
	case errors.Is(err, context.DeadlineExceeded):
		return mk(http.StatusGatewayTimeout, CodeTimeout)
	case errors.Is(err, context.Canceled):
		return mk(499, CodeCanceled)
	case errors.As(err, &mbe):
		return mk(http.StatusRequestEntityTooLarge, CodeBodyTooLarge)
	}
	return mk(http.StatusInternalServerError, CodeInternal)
}

// writeProblem writes p outside huma (auth, limits, WebSocket upgrade).
func writeProblem(w http.ResponseWriter, p *Problem) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}

// unrouted answers a request no route takes (404, or 405 with its Allow
// header) with a problem, as every other error is; ServeMux's own answers
// are plain text.
func unrouted(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(&unroutedWriter{ResponseWriter: w, r: r}, r)
	})
}

// unroutedWriter turns ServeMux's 404 and 405 into problems and drops the
// text that follows them.
type unroutedWriter struct {
	http.ResponseWriter
	r    *http.Request
	done bool
}

func (w *unroutedWriter) WriteHeader(code int) {
	switch code {
	case http.StatusNotFound:
		w.done = true
		w.Header().Del("X-Content-Type-Options")
		writeProblem(w.ResponseWriter, &Problem{Status: code, Code: CodeNotFound,
			Detail: fmt.Sprintf("no route %s %s: the API's paths are in GET /openapi.json", w.r.Method, w.r.URL.Path)})
	case http.StatusMethodNotAllowed:
		w.done = true
		w.Header().Del("X-Content-Type-Options")
		writeProblem(w.ResponseWriter, &Problem{Status: code, Code: CodeMethodNotAllowed,
			Detail: fmt.Sprintf("%s takes %s, not %s", w.r.URL.Path, w.Header().Get("Allow"), w.r.Method)})
	default:
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *unroutedWriter) Write(b []byte) (int, error) {
	if w.done {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}
