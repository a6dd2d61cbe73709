//go:build linux

package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/tarfs"
	"github.com/airlock-run/airlock/internal/transport"
)

// fileChunk is the size of the data chunks the agent sends (well under
// transport.MaxFrame; the stream's 1 MiB window gives the backpressure).
const fileChunk = 256 << 10

// readDirBatch is how many entries one ReadDir message carries.
const readDirBatch = 512

// fileCalls are the file calls of agent.proto.
var fileCalls = map[string]func(*Server, *fileStream, *agentpb.FileRequest) error{
	"Stat":      (*Server).stat,
	"ReadDir":   (*Server).readDir,
	"MkdirAll":  (*Server).mkdirAll,
	"Remove":    (*Server).remove,
	"ReadFile":  (*Server).readFile,
	"WriteFile": (*Server).writeFile,
	"CopyIn":    (*Server).copyIn,
	"CopyOut":   (*Server).copyOut,
}

// handleFile serves method if it is a file call; ok is false otherwise.
func (s *Server) handleFile(method string, st *transport.Stream) (ok bool, err error) {
	h, ok := fileCalls[method]
	if !ok {
		return false, nil
	}
	fs := &fileStream{st: st}
	m := new(agentpb.FileUp)
	if err := st.Recv(m); err != nil {
		return true, err
	}
	req, isReq := m.Msg.(*agentpb.FileUp_Request)
	if !isReq || req.Request == nil {
		return true, errors.New("first file call message must be a request")
	}
	if err := h(s, fs, req.Request); err != nil {
		return true, fs.result(resultOf(err))
	}
	return true, nil
}

type fileStream struct{ st *transport.Stream }

func (f *fileStream) result(r *agentpb.FileResult) error {
	return f.st.Send(&agentpb.FileDown{Msg: &agentpb.FileDown_Result{Result: r}})
}

// Write sends b as data chunks.
func (f *fileStream) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), fileChunk)
		if err := f.st.Send(&agentpb.FileDown{Msg: &agentpb.FileDown_Data{Data: b[:k]}}); err != nil {
			return n, err
		}
		b, n = b[k:], n+k
	}
	return n, nil
}

// upReader reads the client's data chunks until eof.
type upReader struct {
	st   *transport.Stream
	buf  []byte
	done bool
}

func (u *upReader) Read(p []byte) (int, error) {
	for len(u.buf) == 0 {
		if u.done {
			return 0, io.EOF
		}
		m := new(agentpb.FileUp)
		if err := u.st.Recv(m); err != nil {
			if err == io.EOF {
				return 0, errors.New("the host ended the transfer before its end")
			}
			return 0, err
		}
		switch x := m.Msg.(type) {
		case *agentpb.FileUp_Data:
			u.buf = x.Data
		case *agentpb.FileUp_Eof:
			u.done = true
		}
	}
	n := copy(p, u.buf)
	u.buf = u.buf[n:]
	return n, nil
}

// resultOf turns an error into a failed result: op, path and errno kept.
func resultOf(err error) *agentpb.FileResult {
	r := &agentpb.FileResult{Error: err.Error()}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		r.Op, r.Path = pe.Op, pe.Path
		r.Error = pe.Err.Error()
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		r.Errno = int32(en)
	}
	return r
}

func (s *Server) root() (*tarfs.Root, error) {
	dir := s.cfg.Root
	if dir == "" {
		dir = "/"
	}
	return tarfs.OpenRoot(dir, tarfs.InRoot)
}

func infoPB(i tarfs.Info) *agentpb.FileInfo {
	return &agentpb.FileInfo{
		Name: i.Name, Size: i.Size, Mode: uint32(i.Mode), MtimeNs: i.ModTime.UnixNano(),
		Uid: uint32(i.UID), Gid: uint32(i.GID), Link: i.Link,
	}
}

func (s *Server) stat(f *fileStream, req *agentpb.FileRequest) error {
	r, err := s.root()
	if err != nil {
		return err
	}
	defer r.Close()
	i, err := r.Stat(req.Path, req.Follow)
	if err != nil {
		return err
	}
	return f.result(&agentpb.FileResult{Infos: []*agentpb.FileInfo{infoPB(i)}})
}

func (s *Server) readDir(f *fileStream, req *agentpb.FileRequest) error {
	r, err := s.root()
	if err != nil {
		return err
	}
	defer r.Close()
	var batch []*agentpb.FileInfo
	err = r.ReadDir(req.Path, func(i tarfs.Info) error {
		batch = append(batch, infoPB(i))
		if len(batch) == readDirBatch {
			if err := f.result(&agentpb.FileResult{Infos: batch, More: true}); err != nil {
				return err
			}
			batch = nil
		}
		return nil
	})
	if err != nil {
		return err
	}
	return f.result(&agentpb.FileResult{Infos: batch})
}

func (s *Server) mkdirAll(f *fileStream, req *agentpb.FileRequest) error {
	r, err := s.root()
	if err != nil {
		return err
	}
	defer r.Close()
	perm := fs.FileMode(req.Mode).Perm()
	if perm == 0 {
		perm = 0o755
	}
	if err := r.MkdirAll(req.Path, perm); err != nil {
		return err
	}
	return f.result(&agentpb.FileResult{})
}

func (s *Server) remove(f *fileStream, req *agentpb.FileRequest) error {
	r, err := s.root()
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Remove(req.Path); err != nil {
		return err
	}
	return f.result(&agentpb.FileResult{})
}

func (s *Server) readFile(f *fileStream, req *agentpb.FileRequest) error {
	r, err := s.root()
	if err != nil {
		return err
	}
	defer r.Close()
	file, err := r.OpenFile(req.Path, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return &fs.PathError{Op: "stat", Path: req.Path, Err: err}
	}
	if !fi.Mode().IsRegular() {
		return &fs.PathError{Op: "read", Path: req.Path, Err: fmt.Errorf("not a regular file (%v)", fi.Mode().Type())}
	}
	if err := f.result(&agentpb.FileResult{More: true, Infos: []*agentpb.FileInfo{{Name: fi.Name(), Size: fi.Size(), Mode: uint32(fi.Mode())}}}); err != nil {
		return err
	}
	buf := make([]byte, fileChunk)
	n, err := io.CopyBuffer(f, onlyReader{file}, buf)
	if err != nil {
		return &fs.PathError{Op: "read", Path: req.Path, Err: err}
	}
	return f.result(&agentpb.FileResult{Bytes: n})
}

// onlyReader hides WriterTo/ReaderFrom so that io.CopyBuffer uses the
// chunk-sized buffer.
type onlyReader struct{ io.Reader }

func owner(req *agentpb.FileRequest) (int, int) {
	if req.SetOwner {
		return int(req.Uid), int(req.Gid)
	}
	return -1, -1
}

func (s *Server) writeFile(f *fileStream, req *agentpb.FileRequest) error {
	r, err := s.root()
	if err != nil {
		return err
	}
	defer r.Close()
	perm := fs.FileMode(req.Mode)
	if perm == 0 {
		perm = 0o644
	}
	uid, gid := owner(req)
	n, err := r.WriteFile(req.Path, &upReader{st: f.st}, perm, uid, gid)
	if err != nil {
		return err
	}
	return f.result(&agentpb.FileResult{Bytes: n})
}

func (s *Server) copyIn(f *fileStream, req *agentpb.FileRequest) error {
	r, err := s.root()
	if err != nil {
		return err
	}
	defer r.Close()
	uid, gid := owner(req)
	up := &upReader{st: f.st}
	st, err := r.Extract(req.Path, up, tarfs.ExtractOptions{
		RenameFrom: req.RenameFrom, RenameTo: req.RenameTo,
		Owners: req.Owners, UID: uid, GID: gid,
		// The box is the user's own: devices and setuid files are allowed.
		AllowDevices: true, AllowSetuid: true,
	})
	if err != nil {
		return err
	}
	// Drain what follows the tar's end (padding) up to eof.
	io.Copy(io.Discard, up)
	return f.result(&agentpb.FileResult{Bytes: st.Bytes})
}

func (s *Server) copyOut(f *fileStream, req *agentpb.FileRequest) error {
	r, err := s.root()
	if err != nil {
		return err
	}
	defer r.Close()
	err = r.Archive(req.Path, f, tarfs.ArchiveOptions{FollowTop: req.Follow, Name: req.RenameTo}, func(i tarfs.Info) error {
		return f.result(&agentpb.FileResult{More: true, Infos: []*agentpb.FileInfo{infoPB(i)}})
	})
	if err != nil {
		return err
	}
	return f.result(&agentpb.FileResult{})
}
