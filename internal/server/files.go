package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
)

// Problem codes of the files endpoints (errno of the box's file call).
const (
	CodeFileNotFound  = "file_not_found"
	CodeNotADirectory = "not_a_directory"
	CodeIsADirectory  = "is_a_directory"
	CodeFileExists    = "file_exists"
	CodePermission    = "permission_denied"
	CodeReadOnlyFS    = "read_only_filesystem"
	CodeNoSpace       = "no_space"
	CodeInvalidPath   = "invalid_path"
	CodeNotRegular    = "not_a_regular_file"
)

// DefaultMaxUploadBytes bounds the body of a file or tar upload
// (Config.MaxUploadBytes): 1 GiB.
const DefaultMaxUploadBytes = 1 << 30

// FileInfo describes a file in a box.
type FileInfo struct {
	Name    string    `json:"name" doc:"Base name."`
	Type    string    `json:"type" enum:"file,dir,symlink,other" doc:"file (regular), dir, symlink (list only: stat follows links) or other (device, FIFO, socket)."`
	Size    int64     `json:"size" doc:"Bytes."`
	Mode    int       `json:"mode" doc:"Unix permission bits with setuid (0o4000), setgid (0o2000) and sticky (0o1000), e.g. 420 for 0644."`
	ModTime time.Time `json:"mod_time"`
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	Link    string    `json:"link,omitempty" doc:"A symlink's target."`
}

func fileInfoOf(i airlock.FileInfo) FileInfo {
	t := "other"
	switch {
	case i.Mode.IsRegular():
		t = "file"
	case i.Mode.IsDir():
		t = "dir"
	case i.Mode&fs.ModeSymlink != 0:
		t = "symlink"
	}
	return FileInfo{Name: i.Name, Type: t, Size: i.Size, Mode: unixMode(i.Mode), ModTime: i.ModTime, UID: i.UID, GID: i.GID, Link: i.Link}
}

func unixMode(m fs.FileMode) int {
	u := int(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

func fileMode(u int) fs.FileMode {
	m := fs.FileMode(u) & fs.ModePerm
	if u&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// DirList is the body of GET /v1/boxes/{id}/files/list.
type DirList struct {
	Path    string     `json:"path"`
	Entries []FileInfo `json:"entries" doc:"Sorted by name; symlinks are not followed."`
}

// MkdirRequest is the body of POST /v1/boxes/{id}/files/mkdir.
type MkdirRequest struct {
	Path string `json:"path" minLength:"1" maxLength:"4096" doc:"Absolute path; missing parents are created too."`
	Mode int    `json:"mode,omitempty" minimum:"0" maximum:"4095" doc:"Permission bits (default 0o755 = 493)."`
}

// fileProblem maps a file call's error to a problem by its errno.
func fileProblem(err error) error {
	mk := func(status int, code string) *Problem {
		return &Problem{Status: status, Title: http.StatusText(status), Code: code, Detail: err.Error()}
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return &Problem{Status: http.StatusRequestEntityTooLarge, Title: http.StatusText(http.StatusRequestEntityTooLarge), Code: CodeBodyTooLarge,
			Detail: fmt.Sprintf("upload over the server's limit of %d bytes (airlock serve --max-upload); nothing was written", mbe.Limit)}
	case errors.Is(err, fs.ErrNotExist):
		return mk(http.StatusNotFound, CodeFileNotFound)
	case errors.Is(err, syscall.ENOTDIR):
		return mk(http.StatusConflict, CodeNotADirectory)
	case errors.Is(err, syscall.EISDIR), strings.Contains(err.Error(), "not a regular file (d"):
		p := mk(http.StatusConflict, CodeIsADirectory)
		p.Detail += ": a directory is read with GET /v1/boxes/{id}/archive (tar)"
		return p
	case strings.Contains(err.Error(), "not a regular file"):
		return mk(http.StatusConflict, CodeNotRegular)
	case errors.Is(err, fs.ErrExist):
		return mk(http.StatusConflict, CodeFileExists)
	case errors.Is(err, syscall.EROFS):
		return mk(http.StatusConflict, CodeReadOnlyFS)
	case errors.Is(err, fs.ErrPermission):
		return mk(http.StatusForbidden, CodePermission)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return mk(http.StatusInsufficientStorage, CodeNoSpace)
	case errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.EINVAL):
		return mk(http.StatusBadRequest, CodeInvalidPath)
	}
	return problem(err)
}

// boxFilePath checks a path given by a client: absolute, bounded, no NUL.
func boxFilePath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") || len(p) > 4096 || strings.ContainsRune(p, 0) {
		return "", &Problem{Status: http.StatusBadRequest, Code: CodeInvalidPath,
			Detail: fmt.Sprintf("path %q: give an absolute path in the box (at most 4096 bytes)", p)}
	}
	return p, nil
}

type filePathInput struct {
	ID   string `path:"id" maxLength:"128" doc:"Box id, unique id prefix, or name."`
	Path string `query:"path" required:"true" maxLength:"4096" doc:"Absolute path in the box."`
}

var fileErrors = []int{http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound, http.StatusConflict, http.StatusBadGateway}

// fileOp runs f on the box with the box marked in use (idle_timeout).
func (s *Server) fileOp(ctx context.Context, id, p string, f func(b *airlock.Box, p string) error) error {
	p, err := boxFilePath(p)
	if err != nil {
		return err
	}
	b, err := s.callBox(ctx, id)
	if err != nil {
		return err
	}
	if err := f(b, p); err != nil {
		return fileProblem(err)
	}
	return nil
}

func (s *Server) registerFiles() {
	huma.Register(s.api, huma.Operation{
		OperationID: "stat-file", Method: http.MethodGet, Path: "/v1/boxes/{id}/files/stat", Tags: []string{"files"},
		Summary: "Stat a file", Description: "Information on a path in the box; symlinks are followed (inside the box). 404 file_not_found when missing.",
		Errors: fileErrors,
	}, func(ctx context.Context, in *filePathInput) (*struct{ Body FileInfo }, error) {
		out := &struct{ Body FileInfo }{}
		return out, s.fileOp(ctx, in.ID, in.Path, func(b *airlock.Box, p string) error {
			fi, err := b.Stat(ctx, p)
			out.Body = fileInfoOf(fi)
			return err
		})
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "list-files", Method: http.MethodGet, Path: "/v1/boxes/{id}/files/list", Tags: []string{"files"},
		Summary: "List a directory", Description: "The entries of a directory in the box, sorted by name (409 not_a_directory for a file).",
		Errors: fileErrors,
	}, func(ctx context.Context, in *filePathInput) (*struct{ Body DirList }, error) {
		out := &struct{ Body DirList }{}
		return out, s.fileOp(ctx, in.ID, in.Path, func(b *airlock.Box, p string) error {
			infos, err := b.ReadDir(ctx, p)
			out.Body = DirList{Path: p, Entries: make([]FileInfo, 0, len(infos))}
			for _, i := range infos {
				out.Body.Entries = append(out.Body.Entries, fileInfoOf(i))
			}
			return err
		})
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "mkdir", Method: http.MethodPost, Path: "/v1/boxes/{id}/files/mkdir", Tags: []string{"files"},
		Summary: "Make a directory", Description: "Creates a directory and its missing parents; an existing directory is not an error.",
		DefaultStatus: http.StatusNoContent, Errors: fileErrors,
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128"`
		Body MkdirRequest
	}) (*struct{}, error) {
		return nil, s.fileOp(ctx, in.ID, in.Body.Path, func(b *airlock.Box, p string) error {
			return b.MkdirAll(ctx, p, fileMode(in.Body.Mode))
		})
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "remove-file", Method: http.MethodDelete, Path: "/v1/boxes/{id}/files", Tags: []string{"files"},
		Summary: "Remove a file or directory tree", Description: "A directory goes with everything in it; a symlink is removed, not followed.",
		DefaultStatus: http.StatusNoContent, Errors: fileErrors,
	}, func(ctx context.Context, in *filePathInput) (*struct{}, error) {
		return nil, s.fileOp(ctx, in.ID, in.Path, func(b *airlock.Box, p string) error {
			if path.Clean(p) == "/" {
				return &Problem{Status: http.StatusBadRequest, Code: CodeInvalidPath, Detail: "refusing to remove / of the box: remove the box instead"}
			}
			return b.RemovePath(ctx, p)
		})
	})

	s.mux.HandleFunc("GET /v1/boxes/{id}/files", s.handleReadFile)
	s.mux.HandleFunc("PUT /v1/boxes/{id}/files", s.handleWriteFile)
	s.mux.HandleFunc("GET /v1/boxes/{id}/archive", s.handleCopyOut)
	s.mux.HandleFunc("PUT /v1/boxes/{id}/archive", s.handleCopyIn)
	for _, op := range rawFileOperations() {
		s.api.OpenAPI().AddOperation(op)
	}
}

// isUpload reports whether r is a file, tar or box archive upload (bounded by
// MaxUploadBytes rather than MaxBodyBytes).
func isUpload(r *http.Request) bool {
	if r.Method == http.MethodPost && r.URL.Path == importPath {
		return true // a box archive
	}
	return r.Method == http.MethodPut && boxPath.MatchString(r.URL.Path) &&
		(strings.HasSuffix(r.URL.Path, "/files") || strings.HasSuffix(r.URL.Path, "/archive"))
}

// rawBox starts a raw (non-huma) files handler: the box and the checked
// path, or a problem written to w.
func (s *Server) rawBox(w http.ResponseWriter, r *http.Request) (*airlock.Box, string, bool) {
	p, err := boxFilePath(r.URL.Query().Get("path"))
	if err != nil {
		writeProblem(w, err.(*Problem))
		return nil, "", false
	}
	b, err := s.callBox(r.Context(), r.PathValue("id"))
	if err != nil {
		writeProblem(w, err.(*Problem))
		return nil, "", false
	}
	return b, p, true
}

func writeFileProblem(w http.ResponseWriter, err error) {
	writeProblem(w, fileProblem(err).(*Problem))
}

// abort cuts a response whose status is already sent: the client sees a
// truncated body (a Content-Length short, or chunked encoding without its
// end), never a silently short file.
func abort() { panic(http.ErrAbortHandler) }

// handleReadFile serves GET /v1/boxes/{id}/files?path=P: the file's bytes.
func (s *Server) handleReadFile(w http.ResponseWriter, r *http.Request) {
	b, p, ok := s.rawBox(w, r)
	if !ok {
		return
	}
	rc, info, err := b.OpenFile(r.Context(), p)
	if err != nil {
		writeFileProblem(w, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(info.Size, 10))
	h.Set("X-Airlock-Mode", strconv.Itoa(unixMode(info.Mode)))
	if !info.ModTime.IsZero() {
		h.Set("Last-Modified", info.ModTime.UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(http.StatusOK)
	if n, err := io.Copy(w, rc); err != nil || n != info.Size {
		s.log.Warn("file download cut", "box", b.ID(), "path", p, "sent", n, "size", info.Size, "err", err)
		abort()
	}
}

// handleWriteFile serves PUT /v1/boxes/{id}/files?path=P[&mode=0644][&parents=true].
func (s *Server) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	b, p, ok := s.rawBox(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	perm := fs.FileMode(0)
	if m := q.Get("mode"); m != "" {
		u, err := strconv.ParseUint(m, 8, 12)
		if err != nil {
			writeProblem(w, invalidParam("query", "mode", fmt.Sprintf("mode %q: want octal permission bits such as 644 or 0755", m)))
			return
		}
		perm = fileMode(int(u))
	}
	if q.Get("parents") == "true" {
		if err := b.MkdirAll(r.Context(), path.Dir(path.Clean(p)), 0o755); err != nil {
			writeFileProblem(w, err)
			return
		}
	}
	body := newUploadBody(w, r)
	defer body.end()
	if err := b.WriteFileFrom(r.Context(), p, body, perm); err != nil {
		writeFileProblem(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleCopyOut serves GET /v1/boxes/{id}/archive?path=P: a tar stream.
func (s *Server) handleCopyOut(w http.ResponseWriter, r *http.Request) {
	b, p, ok := s.rawBox(w, r)
	if !ok {
		return
	}
	rc, err := b.CopyOutTar(r.Context(), p)
	if err != nil {
		writeFileProblem(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Warn("archive download cut", "box", b.ID(), "path", p, "err", err)
		abort()
	}
}

// handleCopyIn serves PUT /v1/boxes/{id}/archive?path=DIR: unpacks a tar
// stream into DIR.
func (s *Server) handleCopyIn(w http.ResponseWriter, r *http.Request) {
	b, p, ok := s.rawBox(w, r)
	if !ok {
		return
	}
	body := newUploadBody(w, r)
	defer body.end()
	if err := b.CopyInTar(r.Context(), p, body); err != nil {
		writeFileProblem(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// rawFileOperations documents the streaming files endpoints, which are
// served outside huma (their bodies are streams, never held in memory).
func rawFileOperations() []*huma.Operation {
	problemRef := map[string]*huma.MediaType{"application/problem+json": {Schema: &huma.Schema{Ref: "#/components/schemas/Problem"}}}
	errs := func(extra ...string) map[string]*huma.Response {
		m := map[string]*huma.Response{
			"400": {Description: "Bad path or parameter (invalid_path, invalid_request).", Content: problemRef},
			"403": {Description: "Permission denied in the box (permission_denied).", Content: problemRef},
			"404": {Description: "No such box (box_not_found) or file (file_not_found).", Content: problemRef},
			"409": {Description: "Box not running, or a file of the wrong kind (not_a_directory, is_a_directory, read_only_filesystem).", Content: problemRef},
			"502": {Description: "The box's VM died (box_died).", Content: problemRef},
		}
		for _, e := range extra {
			switch e {
			case "413":
				m[e] = &huma.Response{Description: "Upload over the server's limit (airlock serve --max-upload): nothing was written.", Content: problemRef}
			case "507":
				m[e] = &huma.Response{Description: "No space left in the box (no_space).", Content: problemRef}
			}
		}
		return m
	}
	param := func(name, in, doc string, required bool) *huma.Param {
		return &huma.Param{Name: name, In: in, Required: required, Description: doc, Schema: &huma.Schema{Type: "string"}}
	}
	id := param("id", "path", "Box id, unique id prefix, or name.", true)
	binary := &huma.Schema{Type: "string", Format: "binary"}
	ok := func(desc, ct string) map[string]*huma.Response {
		return map[string]*huma.Response{"200": {Description: desc, Content: map[string]*huma.MediaType{ct: {Schema: binary}}}}
	}
	noContent := map[string]*huma.Response{"204": {Description: "Done."}}
	merge := func(a, b map[string]*huma.Response) map[string]*huma.Response {
		for k, v := range b {
			a[k] = v
		}
		return a
	}
	return []*huma.Operation{
		{
			OperationID: "read-file", Method: http.MethodGet, Path: "/v1/boxes/{id}/files", Tags: []string{"files"},
			Summary:     "Download a file",
			Description: "The bytes of a regular file of the box, streamed (Content-Length is the size; X-Airlock-Mode the permission bits). Symlinks are followed inside the box. A transfer that fails midway is cut, never completed short. 409 is_a_directory for a directory: use /archive.",
			Parameters:  []*huma.Param{id, param("path", "query", "Absolute path in the box.", true)},
			Responses:   merge(ok("The file's bytes.", "application/octet-stream"), errs()),
		},
		{
			OperationID: "write-file", Method: http.MethodPut, Path: "/v1/boxes/{id}/files", Tags: []string{"files"},
			Summary:     "Upload a file",
			Description: "Writes the request body to a file of the box, streamed, atomically: readers see the old file or the new one, and a failed or cut upload leaves the old one. Bounded by airlock serve --max-upload.",
			Parameters: []*huma.Param{id, param("path", "query", "Absolute path in the box.", true),
				param("mode", "query", "Octal permission bits (default 644).", false),
				param("parents", "query", "true: create missing parent directories (0755).", false)},
			RequestBody: &huma.RequestBody{Required: true, Content: map[string]*huma.MediaType{"application/octet-stream": {Schema: binary}}},
			Responses:   merge(noContent, errs("413", "507")),
		},
		{
			OperationID: "copy-out", Method: http.MethodGet, Path: "/v1/boxes/{id}/archive", Tags: []string{"files"},
			Summary:     "Download a file or directory tree as tar",
			Description: "A tar stream of the path (entries named after its base name, as docker cp BOX:PATH - does): modes, times, symlinks and hard links kept. A trailing / follows a symlinked path. A transfer that fails midway is cut (the chunked body never ends properly).",
			Parameters:  []*huma.Param{id, param("path", "query", "Absolute path in the box.", true)},
			Responses:   merge(ok("The tar stream.", "application/x-tar"), errs()),
		},
		{
			OperationID: "copy-in", Method: http.MethodPut, Path: "/v1/boxes/{id}/archive", Tags: []string{"files"},
			Summary:     "Upload a tar stream into a directory",
			Description: "Unpacks the tar body into an existing directory of the box (as docker cp - BOX:DIR): modes, times, symlinks, hard links and owners kept; every path resolved inside the box; each file lands atomically. Bounded by airlock serve --max-upload.",
			Parameters:  []*huma.Param{id, param("path", "query", "Absolute path of an existing directory in the box.", true)},
			RequestBody: &huma.RequestBody{Required: true, Content: map[string]*huma.MediaType{"application/x-tar": {Schema: binary}}},
			Responses:   merge(noContent, errs("413", "507")),
		},
	}
}
