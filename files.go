package airlock

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/tarfs"
)

// FileInfo describes a file in a box.
type FileInfo struct {
	Name    string      // base name
	Size    int64       // bytes
	Mode    fs.FileMode // type and permission bits, as io/fs
	ModTime time.Time
	UID     int
	GID     int
	Link    string // symlink target; "" when not a symlink
}

// IsDir reports whether the file is a directory.
func (f FileInfo) IsDir() bool { return f.Mode.IsDir() }

// CopyOptions tune CopyIn, CopyOut and their tar variants. The zero value
// is what `docker cp` does.
type CopyOptions struct {
	// Owner, when set, makes every file copied into the box (CopyIn,
	// CopyInTar, WriteFile) belong to UID:GID. Without it CopyIn keeps the
	// host owners when the caller is root and gives files to root
	// otherwise; CopyInTar keeps the archive's owners.
	Owner    bool
	UID, GID int
	// KeepOwners makes CopyOut give the files the owners they have in the
	// box (only when the caller is root); by default they belong to the
	// caller.
	KeepOwners bool
	// AllowDevices lets CopyOut create device nodes and FIFOs on the host;
	// by default an archive holding one fails with an error naming it.
	AllowDevices bool
	// AllowSetuid keeps setuid/setgid bits on files CopyOut creates; by
	// default they are cleared.
	AllowSetuid bool
	// MaxBytes bounds the bytes CopyOut writes on the host (the box chooses
	// what it sends); 0 means no bound.
	MaxBytes int64
}

func copyOpts(o []CopyOptions) CopyOptions {
	if len(o) > 0 {
		return o[0]
	}
	return CopyOptions{}
}

// fileErr returns err as it is when the agent reported a file error (an
// *fs.PathError naming the path in the box), else explains the transport
// failure.
func (b *Box) fileErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("box %s: %w", b.id, err)
	}
	if strings.Contains(err.Error(), "unknown call") {
		return fmt.Errorf("box %s: its agent has no file calls: restart the box (airlock stop, then start): %w", b.id, err)
	}
	return b.callErr(err)
}

func (b *Box) simpleFile(ctx context.Context, method string, req *client.FileRequest) (*agentpb.FileResult, error) {
	defer b.useBegin(ctx)()
	c, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	r, err := c.SimpleFile(ctx, method, req)
	if err != nil {
		return nil, b.fileErr(err)
	}
	return r, nil
}

func fileInfo(i client.FileInfo) FileInfo {
	return FileInfo{Name: i.Name, Size: i.Size, Mode: i.Mode, ModTime: i.ModTime, UID: i.UID, GID: i.GID, Link: i.Link}
}

// Stat returns information on path in the box, following symlinks (which
// are resolved inside the box: a symlink cannot lead out of it). A missing
// path is an error with errors.Is(err, fs.ErrNotExist).
func (b *Box) Stat(ctx context.Context, p string) (FileInfo, error) {
	r, err := b.simpleFile(ctx, "Stat", &client.FileRequest{Path: p, Follow: true})
	if err != nil {
		return FileInfo{}, err
	}
	infos := client.Infos(r)
	if len(infos) != 1 {
		return FileInfo{}, fmt.Errorf("box %s: stat %s: agent answered %d entries", b.id, p, len(infos))
	}
	return fileInfo(infos[0]), nil
}

// Bounds on what ReadDir accepts from a box (the box chooses what it
// sends): entries, bytes of names and link targets in all, and bytes of
// one name or link target (PATH_MAX; a real name has at most 255).
const (
	maxDirEntries = 1 << 20
	maxDirBytes   = 64 << 20
	maxPathBytes  = 4096
)

// ReadDir lists directory path in the box, sorted by name. Entries are not
// followed: a symlink is reported as one, with its target in Link. A
// listing past 1 Mi entries or 64 MiB of names and link targets, or with
// a name or link target longer than 4096 bytes, is an error.
func (b *Box) ReadDir(ctx context.Context, p string) ([]FileInfo, error) {
	defer b.useBegin(ctx)()
	c, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	f, err := c.File(ctx, "ReadDir", &client.FileRequest{Path: p})
	if err != nil {
		return nil, b.fileErr(err)
	}
	defer f.Close()
	var out []FileInfo
	size := 0
	for {
		r, err := f.Result()
		if err != nil {
			return nil, b.fileErr(err)
		}
		for _, i := range r.Infos {
			if err := checkDirEntry(i); err != nil {
				return nil, fmt.Errorf("box %s: readdir %s: %w", b.id, p, err)
			}
			size += len(i.Name) + len(i.Link)
		}
		if size > maxDirBytes {
			return nil, fmt.Errorf("box %s: readdir %s: more than %d MiB of names: refused", b.id, p, maxDirBytes>>20)
		}
		if len(out)+len(r.Infos) > maxDirEntries {
			return nil, fmt.Errorf("box %s: readdir %s: more than %d entries", b.id, p, maxDirEntries)
		}
		for _, i := range client.Infos(r) {
			out = append(out, fileInfo(i))
		}
		if !r.More {
			return out, nil
		}
	}
}

// checkDirEntry refuses a listing entry no directory can hold: an empty
// name, one with "/" or NUL, "." or "..", or a name or link target past
// maxPathBytes.
func checkDirEntry(i *agentpb.FileInfo) error {
	switch {
	case len(i.Name) > maxPathBytes:
		return fmt.Errorf("the box sent a name of %d bytes (at most %d): refused", len(i.Name), maxPathBytes)
	case len(i.Link) > maxPathBytes:
		return fmt.Errorf("the box sent a link target of %d bytes (at most %d): refused", len(i.Link), maxPathBytes)
	case i.Name == "" || i.Name == "." || i.Name == ".." || strings.ContainsAny(i.Name, "/\x00"):
		return fmt.Errorf("the box sent an entry named %q, which no directory holds: refused", i.Name)
	}
	return nil
}

// MkdirAll creates directory path in the box with its missing parents,
// with permission perm (0: 0755). An existing directory is not an error.
func (b *Box) MkdirAll(ctx context.Context, p string, perm fs.FileMode) error {
	_, err := b.simpleFile(ctx, "MkdirAll", &client.FileRequest{Path: p, Mode: uint32(perm.Perm())})
	return err
}

// RemovePath removes path in the box; a directory is removed with
// everything in it, a symlink is removed, not followed. A missing path is an
// error (errors.Is(err, fs.ErrNotExist)). (Box.Remove removes the box.)
func (b *Box) RemovePath(ctx context.Context, p string) error {
	_, err := b.simpleFile(ctx, "Remove", &client.FileRequest{Path: p})
	return err
}

// MaxReadFile bounds what ReadFile holds in memory (1 GiB): a box decides
// what it sends. Use CopyOut or CopyOutTar for larger files.
const MaxReadFile = 1 << 30

// readFileHint bounds the buffer ReadFile sets aside for the size the box
// declares before any data arrived.
const readFileHint = 8 << 20

// ReadFile returns the contents of the regular file path in the box (at
// most MaxReadFile bytes, else an error).
func (b *Box) ReadFile(ctx context.Context, p string) ([]byte, error) {
	defer b.useBegin(ctx)()
	c, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	f, err := c.File(ctx, "ReadFile", &client.FileRequest{Path: p})
	if err != nil {
		return nil, b.fileErr(err)
	}
	defer f.Close()
	first, err := f.Result()
	if err != nil {
		return nil, b.fileErr(err)
	}
	// The size the box declares is a hint, not an allocation: the buffer
	// grows with the data that arrives, from at most readFileHint.
	var buf bytes.Buffer
	if is := client.Infos(first); len(is) == 1 && is[0].Size > 0 {
		buf.Grow(int(min(is[0].Size, readFileHint)))
	}
	for {
		d, r, err := f.Next()
		if err != nil {
			return nil, b.fileErr(err)
		}
		if r != nil {
			return buf.Bytes(), nil
		}
		if buf.Len()+len(d) > MaxReadFile {
			return nil, fmt.Errorf("box %s: read %s: larger than %d bytes: use CopyOut", b.id, p, MaxReadFile)
		}
		buf.Write(d)
	}
}

// WriteFile writes data to path in the box with permission perm (0: 0644),
// atomically: the data goes to a temporary file in the same directory,
// renamed over path once complete, so readers see the old file or the new
// one, and a failed write leaves the old file (a symlink at path is
// replaced, not followed). The file belongs to root unless opts give an
// owner. Errors name the path (no space left, missing directory, ...).
func (b *Box) WriteFile(ctx context.Context, p string, data []byte, perm fs.FileMode, opts ...CopyOptions) error {
	o := copyOpts(opts)
	req := &client.FileRequest{Path: p, Mode: uint32(perm & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)), SetOwner: true}
	if o.Owner {
		req.Uid, req.Gid = uint32(o.UID), uint32(o.GID)
	}
	_, err := b.sendFile(ctx, "WriteFile", req, bytes.NewReader(data))
	return err
}

// sendFile runs a file call that uploads src (WriteFile, CopyIn) and
// returns its result. The upload runs beside the wait for the result, so
// an agent that fails early (no space, bad path, read-only destination)
// ends the call at once with its error, even while a Read of src is
// still pending: src is never read again after sendFile returns, and
// what a pending Read returns is dropped. A src that
// is an io.Closer (CopyIn's own pipe) is closed, which ends such a Read.
func (b *Box) sendFile(ctx context.Context, method string, req *client.FileRequest, src io.Reader) (*agentpb.FileResult, error) {
	defer b.useBegin(ctx)()
	c, err := b.client(ctx)
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

// CopyInTar unpacks the tar stream r into directory boxDir of the box
// (which must exist), as `docker cp - BOX:DIR` does: modes, times,
// symlinks and hard links are kept, and owners too unless opts give one.
// Every path is resolved inside the box, so a symlink in the box cannot
// redirect the copy elsewhere; each file is written under a temporary name
// and renamed into place, so a failure leaves no half-written file.
//
// When the box fails the copy (a read-only or full destination, a missing
// directory) or ctx ends, CopyInTar returns at once with that error and
// reads r no more, even if a Read of r is still pending then: that Read
// is left to return on its own, and its data is dropped. CopyInTar does
// not close r (whoever made it does; closing it, or a read deadline,
// ends such a Read).
func (b *Box) CopyInTar(ctx context.Context, boxDir string, r io.Reader, opts ...CopyOptions) error {
	o := copyOpts(opts)
	req := &client.FileRequest{Path: boxDir, Owners: true}
	if o.Owner {
		req.SetOwner, req.Uid, req.Gid = true, uint32(o.UID), uint32(o.GID)
	}
	_, err := b.sendFile(ctx, "CopyIn", req, onlyReader{r})
	return err
}

type onlyReader struct{ io.Reader }

// target is where a copy lands, by `docker cp` rules: the source's top
// entry is extracted into dir, renamed to name ("" keeps it, "." puts a
// directory's contents into dir).
type target struct{ dir, name string }

// cpTarget applies `docker cp`'s rules: src is a directory or not, and
// ends in "/." (contents only); dst exists or not, is a directory or not,
// ends in "/".
func cpTarget(src string, srcIsDir bool, dst string, dstExists, dstIsDir bool) (target, error) {
	contents := strings.HasSuffix(src, "/.")
	dstSlash := strings.HasSuffix(dst, "/") || strings.HasSuffix(dst, "/.")
	if (contents || strings.HasSuffix(src, "/")) && !srcIsDir {
		return target{}, fmt.Errorf("%s: not a directory", src)
	}
	clean := path.Clean(dst)
	switch {
	case !dstExists:
		if dstSlash && !srcIsDir {
			return target{}, fmt.Errorf("%s: destination directory does not exist", dst)
		}
		return target{dir: path.Dir(clean), name: path.Base(clean)}, nil
	case dstIsDir:
		if contents {
			return target{dir: clean, name: "."}, nil
		}
		return target{dir: clean}, nil
	default:
		if srcIsDir {
			return target{}, fmt.Errorf("cannot copy directory %s to %s: it is a file", src, dst)
		}
		if dstSlash {
			return target{}, fmt.Errorf("%s: not a directory", dst)
		}
		return target{dir: path.Dir(clean), name: path.Base(clean)}, nil
	}
}

// CopyIn copies hostPath (a file or a directory tree) to boxPath in the
// box with `docker cp` semantics: a directory copied to a missing path is
// created there; to an existing directory, it goes inside it (its contents
// only when hostPath ends in "/."); a file replaces an existing file or
// goes inside an existing directory; a missing destination ending in "/"
// is an error for a file. Modes, times, symlinks (not followed, except
// hostPath itself when it ends in "/") and hard links are kept. See
// CopyInTar for the guarantees in the box.
func (b *Box) CopyIn(ctx context.Context, hostPath, boxPath string, opts ...CopyOptions) error {
	o := copyOpts(opts)
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
	t, err := cpTarget(hostPath, fi.IsDir(), boxPath, exists, exists && dst.IsDir())
	if err != nil {
		return fmt.Errorf("copy %s to box %s: %w", hostPath, b.id, err)
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
	_, err = b.sendFile(ctx, "CopyIn", req, pr)
	pr.CloseWithError(errors.New("copy ended"))
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) && !strings.HasPrefix(err.Error(), "box ") {
			return fmt.Errorf("copy %s to box %s: %w", hostPath, b.id, err)
		}
		return err
	}
	return nil
}

// callReader reads the data a file call sends (a CopyOut's archive, a
// ReadFile's bytes) until the call's result; a failed call is the error of
// the Read that reaches it.
type callReader struct {
	b    *Box
	f    *client.FileCall
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

func (b *Box) copyOut(ctx context.Context, boxPath string) (*callReader, FileInfo, error) {
	b.touch(ctx)
	c, err := b.client(ctx)
	if err != nil {
		return nil, FileInfo{}, err
	}
	follow := strings.HasSuffix(boxPath, "/") || strings.HasSuffix(boxPath, "/.")
	f, err := c.File(ctx, "CopyOut", &client.FileRequest{Path: boxPath, Follow: follow})
	if err != nil {
		return nil, FileInfo{}, b.fileErr(err)
	}
	first, err := f.Result()
	if err != nil {
		f.Close()
		return nil, FileInfo{}, b.fileErr(err)
	}
	infos := client.Infos(first)
	if len(infos) != 1 {
		f.Close()
		return nil, FileInfo{}, fmt.Errorf("box %s: copy out %s: agent sent %d top entries", b.id, boxPath, len(infos))
	}
	return &callReader{b: b, f: f}, fileInfo(infos[0]), nil
}

// topName is the name of the top entry of a copy of boxPath from a box:
// its base name, "." for the root directory.
func topName(boxPath string) string {
	n := path.Base(path.Clean("/" + boxPath))
	if n == "/" {
		return "."
	}
	return n
}

// CopyOutTar returns boxPath (a file or a directory tree) of the box as a
// tar stream, entries named after boxPath's base name, as `docker cp
// BOX:PATH -` does. Read it to the end (a failure in the box is the
// reader's error) and close it; closing early abandons the copy. The
// stream has backpressure: a slow reader slows the box down, it does not
// grow host memory.
//
// The archive holds only boxPath's tree: the box's stream is read entry
// by entry and written again, and an entry with an absolute name, "..",
// or a name outside the top entry (or a hard link to one) ends the stream
// with an error naming it, so that a box cannot make the archive write
// elsewhere when it is extracted.
func (b *Box) CopyOutTar(ctx context.Context, boxPath string) (io.ReadCloser, error) {
	t, top, err := b.copyOut(ctx, boxPath)
	if err != nil {
		return nil, err
	}
	want := topName(boxPath)
	if top.Name != want {
		t.Close()
		return nil, fmt.Errorf("copy %s from box %s: the box sent an archive of %q, not %q: refused", boxPath, b.id, top.Name, want)
	}
	pr, pw := io.Pipe()
	go func() {
		err := checkedTar(pw, t, want)
		if err != nil {
			err = fmt.Errorf("copy %s from box %s: %w", boxPath, b.id, err)
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

// checkedTar copies the tar stream src to w, entry by entry, refusing any
// entry that is not top or under top/ (top "." accepts every relative
// name), any hard link to such an entry, and any entry under a symlink
// the archive made earlier (a reader that extracts it would write through
// the link). What follows the archive's end (the box's result) is read to
// its end.
func checkedTar(w io.Writer, src io.Reader, top string) error {
	tr := tar.NewReader(src)
	tw := tar.NewWriter(w)
	links := map[string]bool{} // cleaned names of the symlinks so far
	underLink := func(n string) string {
		c := path.Clean(n)
		for d := path.Dir(c); d != "." && d != "/"; d = path.Dir(d) {
			if links[d] {
				return d
			}
		}
		return ""
	}
	inside := func(n string) bool {
		if n == "" || strings.HasPrefix(n, "/") {
			return false
		}
		for _, c := range strings.Split(n, "/") {
			if c == ".." {
				return false
			}
		}
		c := path.Clean(n)
		return top == "." || c == top || strings.HasPrefix(c, top+"/")
	}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the box's archive: %w", err)
		}
		if !inside(h.Name) {
			return fmt.Errorf("entry %q is outside %q: refused", h.Name, top)
		}
		if h.Typeflag == tar.TypeLink && !inside(h.Linkname) {
			return fmt.Errorf("hard link %q to %q, outside %q: refused", h.Name, h.Linkname, top)
		}
		if l := underLink(h.Name); l != "" {
			return fmt.Errorf("entry %q is under the symlink %q: refused", h.Name, l)
		}
		if h.Typeflag == tar.TypeSymlink {
			links[path.Clean(h.Name)] = true
		} else {
			delete(links, path.Clean(h.Name))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, src)
	return err
}

// CopyOut copies boxPath (a file or a directory tree) of the box to
// hostPath with the rules of CopyIn. It never writes outside the
// destination: entries with ".." or absolute names are refused, no
// symlink (from the box or already there) is followed while creating
// files, device nodes are refused and setuid bits cleared unless opts
// allow them; a destination that is itself a symlink is refused. Each file
// is written under a temporary name and renamed into place. Every error
// names the path.
func (b *Box) CopyOut(ctx context.Context, boxPath, hostPath string, opts ...CopyOptions) error {
	o := copyOpts(opts)
	ts, top, err := b.copyOut(ctx, boxPath)
	if err != nil {
		return err
	}
	defer ts.Close()
	if lfi, err := os.Lstat(filepath.Clean(hostPath)); err == nil && lfi.Mode()&fs.ModeSymlink != 0 {
		// It may be a link a box made in an earlier copy: never write
		// through one.
		return fmt.Errorf("copy %s from box %s: destination %s is a symlink: give the directory it points to", boxPath, b.id, hostPath)
	}
	dst, err := os.Stat(hostPath)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	t, err := cpTarget(boxPath, top.IsDir(), hostPath, exists, exists && dst.IsDir())
	if err != nil {
		return fmt.Errorf("copy %s from box %s: %w", boxPath, b.id, err)
	}
	root, err := tarfs.OpenRoot(t.dir, tarfs.Beneath)
	if err != nil {
		return fmt.Errorf("copy %s from box %s: %w", boxPath, b.id, err)
	}
	defer root.Close()
	// The box names the archive's top entry; it must be the one asked for
	// (boxPath's base name), and every entry must be under it: the copy
	// lands at the name the host chose, and a box that sends anything
	// else fails the copy before it is written.
	want := topName(boxPath)
	if top.Name != want {
		return fmt.Errorf("copy %s from box %s: the box sent an archive of %q, not %q: refused", boxPath, b.id, top.Name, want)
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
		return fmt.Errorf("copy %s from box %s to %s: %w", boxPath, b.id, t.dir, err)
	}
	// The archive's end: the box's result follows (an error it hit).
	if _, err := io.Copy(io.Discard, ts); err != nil {
		return err
	}
	return nil
}
