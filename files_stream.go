package airlock

import (
	"context"
	"io"
	"io/fs"

	"github.com/airlock-run/airlock/internal/agent/client"
)

// WriteFileFrom is WriteFile with the contents read from r instead of
// held in memory: the bytes stream into the box (with backpressure) and
// land atomically when r ends with io.EOF. An error reading r abandons the
// write, leaving the old file (if any) in place; r is closed when it is an
// io.Closer.
func (b *Box) WriteFileFrom(ctx context.Context, p string, r io.Reader, perm fs.FileMode, opts ...CopyOptions) error {
	o := copyOpts(opts)
	req := &client.FileRequest{Path: p, Mode: uint32(perm & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)), SetOwner: true}
	if o.Owner {
		req.Uid, req.Gid = uint32(o.UID), uint32(o.GID)
	}
	_, err := b.sendFile(ctx, "WriteFile", req, r)
	return err
}

// OpenFile opens the regular file p of the box for streaming reads, as
// ReadFile without holding the file in memory: the FileInfo (size, mode,
// time) is known before the first byte. Read the reader to io.EOF (a
// failure in the box is the reader's error) and close it; closing early
// abandons the transfer. A slow reader slows the box down (backpressure).
func (b *Box) OpenFile(ctx context.Context, p string) (io.ReadCloser, FileInfo, error) {
	b.touch(ctx)
	c, err := b.client(ctx)
	if err != nil {
		return nil, FileInfo{}, err
	}
	f, err := c.File(ctx, "ReadFile", &client.FileRequest{Path: p})
	if err != nil {
		return nil, FileInfo{}, b.fileErr(err)
	}
	first, err := f.Result()
	if err != nil {
		f.Close()
		return nil, FileInfo{}, b.fileErr(err)
	}
	var info FileInfo
	if is := client.Infos(first); len(is) == 1 {
		info = fileInfo(is[0])
	}
	return &callReader{b: b, f: f}, info, nil
}
