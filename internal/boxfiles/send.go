package boxfiles

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/tarfs"
)

// WriteFile writes what r holds, to its io.EOF, to p in the box with
// permission perm (0: 0644), atomically (the agent renames a complete
// temporary file over p); the file belongs to root unless o gives an
// owner. An error reading r abandons the write; r is closed when it is an
// io.Closer.
func (b *Box) WriteFile(ctx context.Context, p string, r io.Reader, perm fs.FileMode, o Options) error {
	req := &client.FileRequest{Path: p, Mode: uint32(perm & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)), SetOwner: true}
	if o.Owner {
		req.Uid, req.Gid = uint32(o.UID), uint32(o.GID)
	}
	_, err := b.send(ctx, "WriteFile", req, r)
	return err
}

// send runs a file call that uploads src (WriteFile, CopyIn) and
// returns its result. The upload runs beside the wait for the result, so
// an agent that fails early (no space, bad path, read-only destination)
// ends the call at once with its error, even while a Read of src is
// still pending: src is never read again after send returns, and
// what a pending Read returns is dropped. A src that
// is an io.Closer (CopyIn's own pipe) is closed, which ends such a Read.
func (b *Box) send(ctx context.Context, method string, req *client.FileRequest, src io.Reader) (*agentpb.FileResult, error) {
	defer b.use(ctx)()
	c, err := b.Agent(ctx)
	if err != nil {
		return nil, err
	}
	f, err := c.File(ctx, method, req)
	if err != nil {
		return nil, b.fileErr(err)
	}
	var (
		mu     sync.Mutex
		over   bool // the result is in: the uploader stops, its errors are not the call's
		srcErr error
	)
	uploaded := make(chan struct{})
	go func() {
		defer close(uploaded)
		buf := make([]byte, 256<<10)
		for {
			n, rerr := src.Read(buf)
			mu.Lock()
			done := over
			if rerr != nil && rerr != io.EOF && !done {
				srcErr = rerr
			}
			mu.Unlock()
			if done {
				return // the call ended while Read was pending: drop what it read
			}
			if n > 0 {
				if _, err := f.Write(buf[:n]); err != nil {
					return // the call is over; the result says why
				}
			}
			if rerr == io.EOF {
				f.CloseWrite()
				return
			}
			if rerr != nil {
				// Abandon the call: the agent removes what it started.
				f.Close()
				return
			}
		}
	}()
	r, err := f.Result()
	mu.Lock()
	over = true
	serr := srcErr
	mu.Unlock()
	f.Close()
	if c, ok := src.(io.Closer); ok {
		c.Close()
		// A pending Read ends with the close (a pipe, a pollable file); a
		// reader whose Close does not end it is left to it, as above.
		select {
		case <-uploaded:
		case <-time.After(2 * time.Second):
		}
	}
	if serr != nil {
		return nil, serr
	}
	if err != nil {
		return nil, b.fileErr(err)
	}
	return r, nil
}

// CopyInTar unpacks the tar stream r into directory boxDir of the box, as
// `docker cp - BOX:DIR` does; owners are kept unless o gives one. It
// never closes r (a failed copy leaves a pending Read of r to return on
// its own, its data dropped).
func (b *Box) CopyInTar(ctx context.Context, boxDir string, r io.Reader, o Options) error {
	req := &client.FileRequest{Path: boxDir, Owners: true}
	if o.Owner {
		req.SetOwner, req.Uid, req.Gid = true, uint32(o.UID), uint32(o.GID)
	}
	_, err := b.send(ctx, "CopyIn", req, onlyReader{r})
	return err
}

// onlyReader hides r's Close from send, which must not close the
// caller's reader.
type onlyReader struct{ io.Reader }

// CopyIn copies hostPath (a file or a directory tree) to boxPath in the
// box with `docker cp` semantics (cpTarget); symlinks are not followed,
// except hostPath itself when it ends in "/". Without an owner in o, the
// files keep their host owners when the caller is root and belong to
// root otherwise.
func (b *Box) CopyIn(ctx context.Context, hostPath, boxPath string, o Options) error {
	follow := strings.HasSuffix(hostPath, "/")
	abs, err := filepath.Abs(hostPath)
	if err != nil {
		return err
	}
	if strings.HasSuffix(hostPath, "/.") {
		follow = true
	}
	var fi os.FileInfo
	if follow {
		fi, err = os.Stat(abs)
	} else {
		fi, err = os.Lstat(abs)
	}
	if err != nil {
		return err
	}
	dst, err := b.Stat(ctx, boxPath)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	t, err := cpTarget(hostPath, fi.IsDir(), boxPath, exists, exists && dst.Mode.IsDir())
	if err != nil {
		return fmt.Errorf("copy %s to box %s: %w", hostPath, b.ID, err)
	}
	root, err := tarfs.OpenRoot(filepath.Dir(abs), 0)
	if err != nil {
		return err
	}
	name := filepath.Base(abs)
	req := &client.FileRequest{Path: t.dir, RenameFrom: name, RenameTo: t.name}
	switch {
	case o.Owner:
		req.SetOwner, req.Uid, req.Gid = true, uint32(o.UID), uint32(o.GID)
	case os.Geteuid() == 0:
		req.Owners = true
	default:
		req.SetOwner = true // root:root, as `docker cp` does
	}
	pr, pw := io.Pipe()
	go func() {
		defer root.Close()
		err := root.Archive(name, pw, tarfs.ArchiveOptions{FollowTop: follow}, nil)
		pw.CloseWithError(err)
	}()
	_, err = b.send(ctx, "CopyIn", req, pr)
	pr.CloseWithError(errors.New("copy ended"))
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) && !strings.HasPrefix(err.Error(), "box ") {
			return fmt.Errorf("copy %s to box %s: %w", hostPath, b.ID, err)
		}
		return err
	}
	return nil
}
