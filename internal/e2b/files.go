package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlock-run/airlock"
	pb "github.com/airlock-run/airlock/internal/e2b/envdpb/filesystem"
	"github.com/airlock-run/airlock/internal/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/airlock-run/airlock/internal/e2b/envdpb/process/processconnect"
)

// Bounds of the filesystem calls.
const (
	// maxListEntries bounds the entries one ListDir returns.
	maxListEntries = 10000
	// maxListDepth bounds ListDir's depth.
	maxListDepth = 64
	// maxUploadParts bounds the files of one multipart upload.
	maxUploadParts = 1000
)

// envdHandler is envd's API for the sandbox: the Connect services and
// HTTP /files, /health.
func (sb *sandbox) envdHandler() http.Handler {
	m := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(int(sb.s.cfg.MaxBodyBytes))}
	m.Handle(processconnect.NewProcessHandler(processService{sb}, opts...))
	m.Handle(filesystemconnect.NewFilesystemHandler(fsService{sb}, opts...))
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.HandleFunc("GET /files", sb.download)
	m.HandleFunc("POST /files", sb.upload)
	m.HandleFunc("GET /envs", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, map[string]string{}) })
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("envd: %s %s is not answered by airlock (see docs/e2b.md)", r.Method, r.URL.Path))
	})
	return m
}

// fsService is envd's filesystem.Filesystem for one sandbox. File calls go
// through the box's agent (as root); paths are resolved against the
// request's user's home, and what is made belongs to that user.
type fsService struct {
	sb *sandbox
}

var _ filesystemconnect.FilesystemHandler = fsService{}

// fsErr maps a file call's error to a Connect error.
func fsErr(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	}
	return connectErr(err)
}

// owner names uid for EntryInfo.
func (sb *sandbox) owner(id int) string {
	sb.userOnce.Lock()
	defer sb.userOnce.Unlock()
	if id == 0 {
		return "root"
	}
	for _, u := range sb.users {
		if u.UID == id {
			return u.Name
		}
	}
	return strconv.Itoa(id)
}

func (sb *sandbox) group(id int) string {
	sb.userOnce.Lock()
	defer sb.userOnce.Unlock()
	if id == 0 {
		return "root"
	}
	for _, u := range sb.users {
		if u.GID == id {
			return u.Name
		}
	}
	return strconv.Itoa(id)
}

// entryOf is E2B's EntryInfo of file p.
func (sb *sandbox) entryOf(p string, fi airlock.FileInfo) *pb.EntryInfo {
	e := &pb.EntryInfo{Name: path.Base(p), Path: p, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		Permissions: fi.Mode.String(), Owner: sb.owner(fi.UID), Group: sb.group(fi.GID),
		ModifiedTime: timestamppb.New(fi.ModTime), Type: pb.FileType_FILE_TYPE_FILE}
	switch {
	case fi.Mode&fs.ModeSymlink != 0:
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		t := fi.Link
		e.SymlinkTarget = &t
	case fi.IsDir():
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
	}
	return e
}

// userFor is the user of a Connect request.
func (s fsService) userFor(ctx context.Context, h http.Header) (userInfo, error) {
	u, err := s.sb.user(ctx, userOfHeader(h))
	if err != nil {
		return u, connectErr(err)
	}
	return u, nil
}

func (s fsService) stat(ctx context.Context, p string) (*pb.EntryInfo, error) {
	fi, err := s.sb.box.Stat(ctx, p)
	if err != nil {
		return nil, fsErr(err)
	}
	return s.sb.entryOf(p, fi), nil
}

func (s fsService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	u, err := s.userFor(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	e, err := s.stat(ctx, u.resolve(req.Msg.GetPath()))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

func (s fsService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	u, err := s.userFor(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	p := u.resolve(req.Msg.GetPath())
	if _, err := s.sb.box.Stat(ctx, p); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
	}
	// mkdir -p as the user: the directories made are the user's, and the
	// user's permissions apply.
	if err := s.sb.run(ctx, u, "mkdir", "-p", "--", p); err != nil {
		return nil, err
	}
	e, err := s.stat(ctx, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

func (s fsService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	u, err := s.userFor(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	src, dst := u.resolve(req.Msg.GetSource()), u.resolve(req.Msg.GetDestination())
	if _, err := s.sb.box.Stat(ctx, src); err != nil {
		return nil, fsErr(err)
	}
	if err := s.sb.run(ctx, u, "mv", "-T", "--", src, dst); err != nil {
		return nil, err
	}
	e, err := s.stat(ctx, dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

func (s fsService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	u, err := s.userFor(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	root := u.resolve(req.Msg.GetPath())
	depth := int(req.Msg.GetDepth())
	if depth <= 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("depth %d: want at most %d", depth, maxListDepth))
	}
	fi, err := s.sb.box.Stat(ctx, root)
	if err != nil {
		return nil, fsErr(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", root))
	}
	out := &pb.ListDirResponse{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		ents, err := s.sb.box.ReadDir(ctx, dir)
		if err != nil {
			return fsErr(err)
		}
		for _, fi := range ents {
			if len(out.Entries) >= maxListEntries {
				return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s holds more than %d entries at depth %d: list a smaller depth or a subdirectory", root, maxListEntries, depth))
			}
			p := path.Join(dir, fi.Name)
			out.Entries = append(out.Entries, s.sb.entryOf(p, fi))
			if fi.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

func (s fsService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	u, err := s.userFor(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	p := u.resolve(req.Msg.GetPath())
	if _, err := s.sb.box.Stat(ctx, p); err != nil {
		return nil, fsErr(err)
	}
	if err := s.sb.box.RemovePath(ctx, p); err != nil {
		return nil, fsErr(err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// run runs a short command as u, its failure an error with its stderr.
func (sb *sandbox) run(ctx context.Context, u userInfo, cmd string, args ...string) error {
	res, err := sb.box.Exec(ctx, cmd, args, airlock.ExecOptions{User: strconv.Itoa(u.UID) + ":" + strconv.Itoa(u.GID), WorkingDir: "/", Timeout: time.Minute, MaxOutput: 64 << 10})
	if err != nil {
		return connectErr(err)
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(string(res.Stderr))
		code := connect.CodeInvalidArgument
		switch {
		case strings.Contains(msg, "Permission denied"):
			code = connect.CodePermissionDenied
		case strings.Contains(msg, "No such file"):
			code = connect.CodeNotFound
		case strings.Contains(msg, "exists"):
			code = connect.CodeAlreadyExists
		}
		return connect.NewError(code, fmt.Errorf("%s: %s", cmd, msg))
	}
	return nil
}

// writeInfo is an entry of a /files upload's answer.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// download answers GET /files?path=P&username=U with the file's bytes.
func (sb *sandbox) download(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	u, err := sb.user(ctx, userOf(r))
	if err != nil {
		writeBoxError(w, err)
		return
	}
	p := u.resolve(r.URL.Query().Get("path"))
	rc, fi, err := sb.box.OpenFile(ctx, p)
	if err != nil {
		writeFileError(w, p, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	io.Copy(w, rc)
}

func writeFileError(w http.ResponseWriter, p string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, fmt.Sprintf("path %s: no such file", p))
	case errors.Is(err, fs.ErrPermission):
		writeError(w, http.StatusForbidden, err.Error())
	default:
		writeBoxError(w, err)
	}
}

// upload answers POST /files: an application/octet-stream body to ?path,
// or multipart/form-data with one or more "file" parts (each to ?path
// when one, else to its file name).
func (sb *sandbox) upload(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	u, err := sb.user(ctx, userOf(r))
	if err != nil {
		writeBoxError(w, err)
		return
	}
	if r.ContentLength > sb.s.cfg.MaxUploadBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("upload of %d bytes is over the server's limit of %d", r.ContentLength, sb.s.cfg.MaxUploadBytes))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, sb.s.cfg.MaxUploadBytes)
	q := r.URL.Query().Get("path")
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writeInfo
	put := func(p string, body io.Reader) error {
		p = u.resolve(p)
		if err := sb.mkdirs(ctx, u, path.Dir(p)); err != nil {
			return err
		}
		if err := sb.box.WriteFileFrom(ctx, p, body, 0o644, airlock.CopyOptions{Owner: true, UID: u.UID, GID: u.GID}); err != nil {
			return err
		}
		out = append(out, writeInfo{Name: path.Base(p), Type: "file", Path: p})
		return nil
	}
	switch mt {
	case "multipart/form-data":
		mr := multipart.NewReader(r.Body, params["boundary"])
		for n := 0; ; n++ {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, "multipart body: "+err.Error())
				return
			}
			if n >= maxUploadParts {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("more than %d files in one upload", maxUploadParts))
				return
			}
			// The SDK names the path in ?path for a single file, in
			// each part's file name for several.
			// The whole name, not Part.FileName's base name: E2B's parts
			// name their path.
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p := dp["filename"]
			if n == 0 && q != "" {
				p = q
			}
			if p == "" {
				writeError(w, http.StatusBadRequest, "a multipart file part without a file name, and no path parameter")
				return
			}
			if err := put(p, part); err != nil {
				writeFileError(w, p, err)
				return
			}
		}
	default:
		if q == "" {
			writeError(w, http.StatusBadRequest, "path: required for an application/octet-stream upload")
			return
		}
		if err := put(q, r.Body); err != nil {
			writeFileError(w, q, err)
			return
		}
	}
	if len(out) == 0 {
		writeError(w, http.StatusBadRequest, "no file in the upload")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// mkdirs makes dir and its parents, as u, unless it exists.
func (sb *sandbox) mkdirs(ctx context.Context, u userInfo, dir string) error {
	if fi, err := sb.box.Stat(ctx, dir); err == nil && fi.IsDir() {
		return nil
	}
	if err := sb.run(ctx, u, "mkdir", "-p", "--", dir); err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodePermissionDenied {
			return fmt.Errorf("%w: %v", fs.ErrPermission, ce.Message())
		}
		return err
	}
	return nil
}
