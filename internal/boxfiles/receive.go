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

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/tarfs"
)

// callReader reads the data a file call sends (a CopyOut's archive, a
// ReadFile's bytes) until the call's result; a failed call is the error of
// the Read that reaches it.
type callReader struct {
	b    *Box
	f    Call
	buf  []byte
	err  error
	once sync.Once
}

func (t *callReader) Read(p []byte) (int, error) {
	for len(t.buf) == 0 {
		if t.err != nil {
			return 0, t.err
		}
		d, r, err := t.f.Next()
		switch {
		case err != nil:
			t.err = t.b.fileErr(err)
		case r != nil:
			t.err = io.EOF
		default:
			t.buf = d
		}
	}
	n := copy(p, t.buf)
	t.buf = t.buf[n:]
	return n, nil
}

// Close ends the transfer (abandoning it if it is not over).
func (t *callReader) Close() error {
	t.once.Do(func() { t.f.Close() })
	return nil
}

// OpenFile opens the regular file p of the box for streaming reads: the
// FileInfo is known before the first byte, a failure in the box is the
// reader's error, closing early abandons the transfer.
func (b *Box) OpenFile(ctx context.Context, p string) (io.ReadCloser, client.FileInfo, error) {
	b.touch(ctx)
	c, err := b.Agent(ctx)
	if err != nil {
		return nil, client.FileInfo{}, err
	}
	f, err := c.File(ctx, "ReadFile", &client.FileRequest{Path: p})
	if err != nil {
		return nil, client.FileInfo{}, b.fileErr(err)
	}
	first, err := f.Result()
	if err != nil {
		f.Close()
		return nil, client.FileInfo{}, b.fileErr(err)
	}
	var info client.FileInfo
	if is := client.Infos(first); len(is) == 1 {
		info = is[0]
	}
	return &callReader{b: b, f: f}, info, nil
}

func (b *Box) copyOut(ctx context.Context, boxPath string) (*callReader, client.FileInfo, error) {
	b.touch(ctx)
	c, err := b.Agent(ctx)
	if err != nil {
		return nil, client.FileInfo{}, err
	}
	follow := strings.HasSuffix(boxPath, "/") || strings.HasSuffix(boxPath, "/.")
	f, err := c.File(ctx, "CopyOut", &client.FileRequest{Path: boxPath, Follow: follow})
	if err != nil {
		return nil, client.FileInfo{}, b.fileErr(err)
	}
	first, err := f.Result()
	if err != nil {
		f.Close()
		return nil, client.FileInfo{}, b.fileErr(err)
	}
	infos := client.Infos(first)
	if len(infos) != 1 {
		f.Close()
		return nil, client.FileInfo{}, fmt.Errorf("box %s: copy out %s: agent sent %d top entries", b.ID, boxPath, len(infos))
	}
	return &callReader{b: b, f: f}, infos[0], nil
}

// CopyOutTar returns boxPath of the box as a tar stream named after its
// base name, as `docker cp BOX:PATH -` does, each entry checked by
// checkedTar. Closing the stream early abandons the copy.
func (b *Box) CopyOutTar(ctx context.Context, boxPath string) (io.ReadCloser, error) {
	t, top, err := b.copyOut(ctx, boxPath)
	if err != nil {
		return nil, err
	}
	want := topName(boxPath)
	if top.Name != want {
		t.Close()
		return nil, fmt.Errorf("copy %s from box %s: the box sent an archive of %q, not %q: refused", boxPath, b.ID, top.Name, want)
	}
	pr, pw := io.Pipe()
	go func() {
		err := checkedTar(pw, t, want)
		if err != nil {
			err = fmt.Errorf("copy %s from box %s: %w", boxPath, b.ID, err)
		}
		pw.CloseWithError(err)
	}()
	return &checkedReader{PipeReader: pr, src: t}, nil
}

// checkedReader is CopyOutTar's stream: closing it abandons the copy.
type checkedReader struct {
	*io.PipeReader
	src *callReader
}

func (c *checkedReader) Close() error {
	c.PipeReader.Close()
	return c.src.Close()
}

// CopyOut copies boxPath of the box to hostPath with `docker cp` rules
// (cpTarget), extracting with tarfs beneath the destination directory: no
// ".." or absolute names, no symlink followed, devices and setuid bits as
// o allows, a destination that is a symlink refused.
func (b *Box) CopyOut(ctx context.Context, boxPath, hostPath string, o Options) error {
	ts, top, err := b.copyOut(ctx, boxPath)
	if err != nil {
		return err
	}
	defer ts.Close()
	if lfi, err := os.Lstat(filepath.Clean(hostPath)); err == nil && lfi.Mode()&fs.ModeSymlink != 0 {
		// It may be a link a box made in an earlier copy: never write
		// through one.
		return fmt.Errorf("copy %s from box %s: destination %s is a symlink: give the directory it points to", boxPath, b.ID, hostPath)
	}
	dst, err := os.Stat(hostPath)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	t, err := cpTarget(boxPath, top.Mode.IsDir(), hostPath, exists, exists && dst.IsDir())
	if err != nil {
		return fmt.Errorf("copy %s from box %s: %w", boxPath, b.ID, err)
	}
	root, err := tarfs.OpenRoot(t.dir, tarfs.Beneath)
	if err != nil {
		return fmt.Errorf("copy %s from box %s: %w", boxPath, b.ID, err)
	}
	defer root.Close()
	// The box names the archive's top entry; it must be the one asked for
	// (boxPath's base name), and every entry must be under it: the copy
	// lands at the name the host chose, and a box that sends anything
	// else fails the copy before it is written.
	want := topName(boxPath)
	if top.Name != want {
		return fmt.Errorf("copy %s from box %s: the box sent an archive of %q, not %q: refused", boxPath, b.ID, top.Name, want)
	}
	to := t.name
	if to == "" {
		to = want
	}
	eo := tarfs.ExtractOptions{
		RenameFrom: want, RenameTo: to, UID: -1, GID: -1,
		Owners:       o.KeepOwners && os.Geteuid() == 0,
		AllowDevices: o.AllowDevices, AllowSetuid: o.AllowSetuid, MaxBytes: o.MaxBytes,
	}
	if _, err := root.Extract(".", ts, eo); err != nil {
		return fmt.Errorf("copy %s from box %s to %s: %w", boxPath, b.ID, t.dir, err)
	}
	// The archive's end: the box's result follows (an error it hit).
	if _, err := io.Copy(io.Discard, ts); err != nil {
		return err
	}
	return nil
}
