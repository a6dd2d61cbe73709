package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"syscall"
	"time"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/transport"
)

// FileInfo describes a file in the box.
type FileInfo struct {
	Name    string
	Size    int64
	Mode    fs.FileMode
	ModTime time.Time
	UID     int
	GID     int
	Link    string // symlink target, "" if not a symlink
}

// FileRequest parameters one file call (see agentpb.FileRequest).
type FileRequest = agentpb.FileRequest

func infoOf(i *agentpb.FileInfo) FileInfo {
	return FileInfo{
		Name: i.Name, Size: i.Size, Mode: fs.FileMode(i.Mode), ModTime: time.Unix(0, i.MtimeNs),
		UID: int(i.Uid), GID: int(i.Gid), Link: i.Link,
	}
}

// resultErr turns a failed result into an *fs.PathError (with the guest's
// errno where it had one, so errors.Is(err, fs.ErrNotExist) works).
func resultErr(method string, r *agentpb.FileResult) error {
	if r.Error == "" {
		return nil
	}
	var e error = errors.New(r.Error)
	if r.Errno != 0 {
		e = syscall.Errno(r.Errno)
		if e.Error() != r.Error {
			e = fmt.Errorf("%s: %w", r.Error, syscall.Errno(r.Errno))
		}
	}
	if r.Path == "" && r.Op == "" {
		return fmt.Errorf("box %s: %w", method, e)
	}
	op := r.Op
	if op == "" {
		op = method
	}
	return &fs.PathError{Op: op, Path: r.Path, Err: e}
}

// FileCall is one running file call.
type FileCall struct {
	method string
	st     *transport.Stream
}

// File starts the file call method with req.
func (c *Client) File(ctx context.Context, method string, req *FileRequest) (*FileCall, error) {
	st, err := c.t.Call(ctx, method)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&agentpb.FileUp{Msg: &agentpb.FileUp_Request{Request: req}}); err != nil {
		st.Close()
		return nil, err
	}
	return &FileCall{method: method, st: st}, nil
}

// Close ends the call (abandons it if it is not over).
func (f *FileCall) Close() error { return f.st.Close() }

// upChunk bounds one data message sent to the agent.
const upChunk = 256 << 10

// Write sends b as data chunks (blocks while the agent is behind).
func (f *FileCall) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), upChunk)
		if err := f.st.Send(&agentpb.FileUp{Msg: &agentpb.FileUp_Data{Data: b[:k]}}); err != nil {
			return n, err
		}
		b, n = b[k:], n+k
	}
	return n, nil
}

// CloseWrite sends the end of the data.
func (f *FileCall) CloseWrite() error {
	return f.st.Send(&agentpb.FileUp{Msg: &agentpb.FileUp_Eof{Eof: true}})
}

// Next returns the next message: data (result nil) or a result (its
// error, if it failed, as err).
func (f *FileCall) Next() (data []byte, res *agentpb.FileResult, err error) {
	m := new(agentpb.FileDown)
	if err := f.st.Recv(m); err != nil {
		if err == io.EOF {
			err = fmt.Errorf("agent %s: the call ended without a result (connection lost?)", f.method)
		}
		return nil, nil, err
	}
	switch x := m.Msg.(type) {
	case *agentpb.FileDown_Data:
		return x.Data, nil, nil
	case *agentpb.FileDown_Result:
		return nil, x.Result, resultErr(f.method, x.Result)
	}
	return nil, nil, fmt.Errorf("agent %s: unexpected message", f.method)
}

// Result waits for a result, failing on data.
func (f *FileCall) Result() (*agentpb.FileResult, error) {
	d, r, err := f.Next()
	if err != nil {
		return r, err
	}
	if r == nil {
		return nil, fmt.Errorf("agent %s: data where a result was expected (%d bytes)", f.method, len(d))
	}
	return r, nil
}

// Infos converts a result's entries.
func Infos(r *agentpb.FileResult) []FileInfo {
	out := make([]FileInfo, 0, len(r.Infos))
	for _, i := range r.Infos {
		out = append(out, infoOf(i))
	}
	return out
}

// SimpleFile makes a file call with no data either way and returns its
// result.
func (c *Client) SimpleFile(ctx context.Context, method string, req *FileRequest) (*agentpb.FileResult, error) {
	f, err := c.File(ctx, method, req)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Result()
}
