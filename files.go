package airlock

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"time"

	"github.com/airlock-run/airlock/internal/boxfiles"
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

func copyOpts(o []CopyOptions) boxfiles.Options {
	if len(o) > 0 {
		return boxfiles.Options(o[0])
	}
	return boxfiles.Options{}
}

// files is the box as internal/boxfiles, which runs the file calls, sees
// it.
func (b *Box) files() *boxfiles.Box {
	return &boxfiles.Box{ID: b.id, Agent: boxfiles.Dial(b.wakeClient), Use: b.useBegin, Touch: b.touch, CallErr: b.callErr}
}

// Stat returns information on path in the box, following symlinks (which
// are resolved inside the box: a symlink cannot lead out of it). A missing
// path is an error with errors.Is(err, fs.ErrNotExist).
func (b *Box) Stat(ctx context.Context, p string) (FileInfo, error) {
	i, err := b.files().Stat(ctx, p)
	return FileInfo(i), err
}

// ReadDir lists directory path in the box, sorted by name. Entries are not
// followed: a symlink is reported as one, with its target in Link. A
// listing past 1 Mi entries or 64 MiB of names and link targets, or with
// a name or link target longer than 4096 bytes, is an error.
func (b *Box) ReadDir(ctx context.Context, p string) ([]FileInfo, error) {
	is, err := b.files().ReadDir(ctx, p)
	var out []FileInfo
	for _, i := range is {
		out = append(out, FileInfo(i))
	}
	return out, err
}

// MkdirAll creates directory path in the box with its missing parents,
// with permission perm (0: 0755). An existing directory is not an error.
func (b *Box) MkdirAll(ctx context.Context, p string, perm fs.FileMode) error {
	return b.files().MkdirAll(ctx, p, perm)
}

// RemovePath removes path in the box; a directory is removed with
// everything in it, a symlink is removed, not followed. A missing path is an
// error (errors.Is(err, fs.ErrNotExist)). (Box.Remove removes the box.)
func (b *Box) RemovePath(ctx context.Context, p string) error {
	return b.files().Remove(ctx, p)
}

// MaxReadFile bounds what ReadFile holds in memory (1 GiB): a box decides
// what it sends. Use CopyOut or CopyOutTar for larger files.
const MaxReadFile = boxfiles.MaxReadFile

// ReadFile returns the contents of the regular file path in the box (at
// most MaxReadFile bytes, else an error).
func (b *Box) ReadFile(ctx context.Context, p string) ([]byte, error) {
	return b.files().ReadFile(ctx, p)
}

// WriteFile writes data to path in the box with permission perm (0: 0644),
// atomically: the data goes to a temporary file in the same directory,
// renamed over path once complete, so readers see the old file or the new
// one, and a failed write leaves the old file (a symlink at path is
// replaced, not followed). The file belongs to root unless opts give an
// owner. Errors name the path (no space left, missing directory, ...).
func (b *Box) WriteFile(ctx context.Context, p string, data []byte, perm fs.FileMode, opts ...CopyOptions) error {
	return b.files().WriteFile(ctx, p, bytes.NewReader(data), perm, copyOpts(opts))
}

// WriteFileFrom is WriteFile with the contents read from r instead of
// held in memory: the bytes stream into the box (with backpressure) and
// land atomically when r ends with io.EOF. An error reading r abandons the
// write, leaving the old file (if any) in place; r is closed when it is an
// io.Closer.
func (b *Box) WriteFileFrom(ctx context.Context, p string, r io.Reader, perm fs.FileMode, opts ...CopyOptions) error {
	return b.files().WriteFile(ctx, p, r, perm, copyOpts(opts))
}

// OpenFile opens the regular file p of the box for streaming reads, as
// ReadFile without holding the file in memory: the FileInfo (size, mode,
// time) is known before the first byte. Read the reader to io.EOF (a
// failure in the box is the reader's error) and close it; closing early
// abandons the transfer. A slow reader slows the box down (backpressure).
func (b *Box) OpenFile(ctx context.Context, p string) (io.ReadCloser, FileInfo, error) {
	rc, i, err := b.files().OpenFile(ctx, p)
	return rc, FileInfo(i), err
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
	return b.files().CopyInTar(ctx, boxDir, r, copyOpts(opts))
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
	return b.files().CopyIn(ctx, hostPath, boxPath, copyOpts(opts))
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
	return b.files().CopyOutTar(ctx, boxPath)
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
	return b.files().CopyOut(ctx, boxPath, hostPath, copyOpts(opts))
}
