package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
)

// A box moves between servers as an archive (airlock export/import, the
// library's Box.Export and Runtime.ImportBox): GET /v1/boxes/{id}/export
// streams it, POST /v1/boxes/import makes a box of one. Both are raw
// handlers (the archive is a stream, never held in memory), documented by
// rawExportOperations.

// importPath is the route of an import; isUpload bounds its body by
// MaxUploadBytes.
const importPath = "/v1/boxes/import"

func (s *Server) registerExport() {
	s.mux.HandleFunc("GET /v1/boxes/{id}/export", s.handleExport)
	s.mux.HandleFunc("POST "+importPath, s.handleImport)
	for _, op := range rawExportOperations() {
		s.api.OpenAPI().AddOperation(op)
	}
}

// boolParam reads query parameter name: "", "false" or "true".
func boolParam(r *http.Request, name string) (bool, *Problem) {
	switch v := r.URL.Query().Get(name); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, &Problem{Status: http.StatusBadRequest, Title: "Bad Request", Code: CodeInvalid,
			Detail: fmt.Sprintf("%s=%q: want true or false", name, v)}
	}
}

// startWriter sends the response's header before the first byte of the
// body, so that an export that fails before it wrote anything is answered
// with a problem instead.
type startWriter struct {
	w       http.ResponseWriter
	started bool
}

func (sw *startWriter) Write(p []byte) (int, error) {
	if !sw.started {
		sw.started = true
		sw.w.Header().Set("Content-Type", "application/x-tar")
		sw.w.WriteHeader(http.StatusOK)
	}
	return sw.w.Write(p)
}

// handleExport serves GET /v1/boxes/{id}/export[?checkpoints=true]: the
// box archive (Box.Export) as a tar stream.
func (s *Server) handleExport(w http.ResponseWriter, r *http.Request) {
	ckpts, p := boolParam(r, "checkpoints")
	if p != nil {
		writeProblem(w, p)
		return
	}
	b, err := s.getBox(r.Context(), r.PathValue("id"))
	if err != nil {
		writeProblem(w, err.(*Problem))
		return
	}
	sw := &startWriter{w: w}
	if _, err := b.Export(r.Context(), sw, airlock.ExportOptions{Checkpoints: ckpts}); err != nil {
		if !sw.started {
			writeProblem(w, problem(err).(*Problem))
			return
		}
		s.log.Warn("export cut", "box", b.ID(), "err", err)
		abort()
	}
}

// handleImport serves POST /v1/boxes/import[?name=N]: makes a box,
// stopped, of the box archive in the body (Runtime.ImportBox) and answers
// 201 with it. The archive's box is held to the policy as a create is;
// archives with memory are refused (they become snapshots: import them on
// the host with airlock import), and so are archives with checkpoints
// unless the server allows them (Policy.AllowImportState).
func (s *Server) handleImport(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	name := r.URL.Query().Get("name")
	if len(name) > 128 {
		writeProblem(w, &Problem{Status: http.StatusBadRequest, Title: "Bad Request", Code: CodeInvalid,
			Detail: "name: at most 128 bytes"})
		return
	}
	body := newUploadBody(w, r)
	defer body.end()
	var release func()
	defer func() {
		if release != nil {
			release()
		}
	}()
	res, err := s.rt.ImportBox(ctx, body, airlock.ImportOptions{Name: ns(ctx, name),
		Admit: func(opts *airlock.BoxOptions, memory bool, checkpoints int) error {
			if memory {
				return &Problem{Status: http.StatusBadRequest, Title: "Bad Request", Code: CodeInvalid,
					Detail: "the archive holds memory (airlock export --with-memory): the API imports box archives without memory; import this one on the server's host with airlock import, or export the box without memory (checkpoints=true keeps its undo points)"}
			}
			if p, _ := s.policyFor(ctx); checkpoints > 0 && !p.AllowImportState {
				return denied("the archive carries %d checkpoints, whose device state QEMU loads at a rollback; this server imports them only with airlock serve --allow-import-state, for its own token (not a tenant's): ask its operator, or export the box without checkpoints", checkpoints)
			}
			// The box is the caller's (its tenant's), whatever labels
			// the exporting server gave it.
			opts.Labels = maps.Clone(opts.Labels)
			delete(opts.Labels, TenantLabel)
			if t := tenantOf(ctx); t != nil {
				if opts.Labels == nil {
					opts.Labels = map[string]string{}
				}
				opts.Labels[TenantLabel] = t.Name
			}
			rel, err := s.checkCreate(ctx, opts)
			release = rel
			return err
		}})
	if err != nil {
		var pr *Problem
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &pr):
		case errors.As(err, &mbe):
			pr = &Problem{Status: http.StatusRequestEntityTooLarge, Title: http.StatusText(http.StatusRequestEntityTooLarge), Code: CodeBodyTooLarge,
				Detail: fmt.Sprintf("archive over the server's limit of %d bytes (airlock serve --max-upload): nothing was imported", mbe.Limit)}
		case errors.Is(err, airlock.ErrLimit):
			pr = &Problem{Status: http.StatusBadRequest, Title: "Bad Request", Code: CodeInvalid, Detail: err.Error()}
		default:
			pr = tenantProblem(ctx, err).(*Problem)
		}
		writeProblem(w, pr)
		return
	}
	out, err := s.boxOut(ctx, res.Box)
	if err != nil {
		writeProblem(w, err.(*Problem))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/boxes/"+res.Box.ID())
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(out.Body)
}

// rawExportOperations documents the export and import endpoints.
func rawExportOperations() []*huma.Operation {
	problemRef := map[string]*huma.MediaType{"application/problem+json": {Schema: &huma.Schema{Ref: "#/components/schemas/Problem"}}}
	binary := &huma.Schema{Type: "string", Format: "binary"}
	param := func(name, in, doc string, required bool) *huma.Param {
		return &huma.Param{Name: name, In: in, Required: required, Description: doc, Schema: &huma.Schema{Type: "string"}}
	}
	return []*huma.Operation{
		{
			OperationID: "export-box", Method: http.MethodGet, Path: "/v1/boxes/{id}/export", Tags: []string{"boxes"},
			Summary:     "Export a box as an archive",
			Description: "The box's archive (as airlock export writes it): its configuration and writable layer, and with checkpoints=true its checkpoints (each whole, with their tree). A running box is flushed and paused while its disk is copied. A transfer that fails midway is cut (the chunked body never ends properly). POST /v1/boxes/import makes a box of it here or on another server with the same image.",
			Parameters: []*huma.Param{param("id", "path", "Box id, unique id prefix, or name.", true),
				param("checkpoints", "query", "true: the box's checkpoints go in the archive too (rollback works on the imported box).", false)},
			Responses: map[string]*huma.Response{
				"200": {Description: "The archive (tar).", Content: map[string]*huma.MediaType{"application/x-tar": {Schema: binary}}},
				"400": {Description: "A bad parameter (invalid_request).", Content: problemRef},
				"404": {Description: "No such box (box_not_found).", Content: problemRef},
				"409": {Description: "The box cannot be exported now (box_not_running, ...).", Content: problemRef},
			},
		},
		{
			OperationID: "import-box", Method: http.MethodPost, Path: importPath, Tags: []string{"boxes"},
			Summary:     "Import a box from an archive",
			Description: "Makes a box, stopped, of the archive in the body (GET /v1/boxes/{id}/export, airlock export), with the archive's options and files, and its checkpoints when it carries them (refused unless airlock serve --allow-import-state: a rollback loads their device state into QEMU). Its image (by digest) must be on this server. The archive is checked as hostile input and the box held to the server's policy as a create is. Archives with memory are refused: import them with airlock import. Bounded by airlock serve --max-upload. Start the box with POST /v1/boxes/{id}/start.",
			Parameters:  []*huma.Param{param("name", "query", "The new box's name (default: none).", false)},
			RequestBody: &huma.RequestBody{Required: true, Content: map[string]*huma.MediaType{"application/x-tar": {Schema: binary}}},
			Responses: map[string]*huma.Response{
				"201": {Description: "The new box.", Content: map[string]*huma.MediaType{"application/json": {Schema: &huma.Schema{Ref: "#/components/schemas/Box"}}}},
				"400": {Description: "Not an archive this server reads, over its bounds, or with memory (invalid_request).", Content: problemRef},
				"403": {Description: "Past the server's policy (policy_denied): caps, quotas, or checkpoints without --allow-import-state.", Content: problemRef},
				"404": {Description: "The archive's image is not on this server (image_not_found).", Content: problemRef},
				"409": {Description: "The name is taken (name_in_use).", Content: problemRef},
				"413": {Description: "Over the server's upload limit (airlock serve --max-upload).", Content: problemRef},
			},
		},
	}
}
