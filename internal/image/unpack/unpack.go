// Package unpack applies OCI image layers (tar streams) to a directory, in
// order, the way a container runtime's overlay snapshotter would see them
// merged: it follows the OCI image spec's layer changeset rules
// (https://github.com/opencontainers/image-spec/blob/main/layer.md),
// including whiteouts (".wh.NAME") and opaque directories (".wh..wh..opq").
//
// It is written for hostile input: an entry whose name or hard-link target is
// absolute or climbs out with "..", is refused with an error wrapping
// ErrUnsafePath; parent directories are resolved with symlinks scoped to the
// root (github.com/cyphar/filepath-securejoin), and the final component is
// never followed (existing entries are replaced, files are created with
// O_EXCL|O_NOFOLLOW), so a layer cannot write outside the target directory.
// Character and block devices are skipped (with a note); FIFOs are created.
// Limits bound the bytes, file sizes and entries an image may unpack to
// (ErrLimit), and runs of zeros are written as holes.
//
// Unlike go-containerregistry's mutate.Extract it applies layers oldest
// first and handles hard links across and within layers.
package unpack

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/image"
)

// ErrUnsafePath is wrapped by errors for layer entries that try to leave the
// target directory (absolute names, ".." components, hard links to outside).
var ErrUnsafePath = errors.New("unsafe path in layer")

// Whiteout prefixes from the OCI image spec (layer.md, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Options tunes Apply. The zero value is ready to use.
type Options struct {
	// Note, if not nil, receives one line per entry that was skipped or only
	// partly applied (device nodes, refused xattrs, unknown entry types).
	Note func(msg string)
	// SkipOwnership leaves files owned by the current user instead of the
	// uid/gid from the layer. Ownership is always skipped when not running
	// as root (Lchown to other users would fail).
	SkipOwnership bool
	// Limits bound the image's total file bytes, file size and entry
	// count; zero fields default from the free space (DefaultLimits).
	// Image applies them to all layers together, Apply to its one layer.
	Limits Limits
}

func (o *Options) note(format string, args ...any) {
	if o.Note != nil {
		o.Note(fmt.Sprintf(format, args...))
	}
}

// Image applies all layers of img from store to the directory root, oldest
// first. root must exist; it is normally empty. Each layer blob is verified
// against its digest as it is read.
func Image(ctx context.Context, store *image.Store, img *image.Image, root string, opts Options) error {
	layers, err := store.Layers(img)
	if err != nil {
		return err
	}
	b := newBudget(opts.Limits, root)
	times := map[string]dirTime{}
	for i, l := range layers {
		rc, err := l.Open()
		if err != nil {
			return fmt.Errorf("layer %d/%d %s: %w", i+1, len(layers), l.Digest, err)
		}
		err = apply(ctx, root, rc, opts, b, times)
		if cerr := rc.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("layer %d/%d %s: %w", i+1, len(layers), l.Digest, err)
		}
	}
	return settleDirTimes(ctx, root, times)
}

// settleDirTimes gives every directory under root (root included) the
// times the last layer that listed it gave it, or the epoch for one no
// layer listed (made for a parent, or the root): a later layer that adds
// or deletes entries in a directory it does not list would otherwise leave
// the directory with the time of this unpack, and the same image would
// unpack differently each time (a root filesystem base must not: see
// rootfs.Base).
func settleDirTimes(ctx context.Context, root string, times map[string]dirTime) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	if rr, err := filepath.EvalSymlinks(root); err == nil {
		root = rr
	}
	epoch := time.Unix(0, 0)
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		t, ok := times[p]
		if !ok {
			t = dirTime{p, epoch, epoch}
		}
		if err := lutimes(p, t.atime, t.mtime); err != nil {
			return fmt.Errorf("set times on %s: %w", p, err)
		}
		return nil
	})
}

type dirTime struct {
	path         string
	atime, mtime time.Time
}

// Apply applies one layer, an uncompressed tar stream, on top of root.
// Entries are applied in archive order. A refused entry (ErrUnsafePath) or
// one past opts.Limits (ErrLimit) stops the layer with an error; root may
// then hold part of the layer.
func Apply(ctx context.Context, root string, r io.Reader, opts Options) error {
	return apply(ctx, root, r, opts, newBudget(opts.Limits, root), nil)
}

// apply applies one layer; times, when not nil, gets the times of each
// directory the layer lists (by path), over those of earlier layers.
func apply(ctx context.Context, root string, r io.Reader, opts Options, b *budget, times map[string]dirTime) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(root); err != nil {
		return err
	} else if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", root)
	}
	// Resolve root itself once, so securejoin works from a real path.
	if rr, err := filepath.EvalSymlinks(root); err == nil {
		root = rr
	}
	chown := !opts.SkipOwnership && os.Geteuid() == 0
	a := &applier{root: root, opts: &opts, chown: chown, written: map[string]bool{}}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer tar: %w", err)
		}
		var sz int64
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA {
			sz = hdr.Size // for sparse entries, the full size, holes included
		}
		if err := b.entry(hdr.Name, sz); err != nil {
			return err
		}
		if err := a.entry(hdr, tr); err != nil {
			return err
		}
	}
	// Directory times last (in reverse, deepest first), since creating
	// entries inside a directory changes its mtime.
	for i := len(a.dirs) - 1; i >= 0; i-- {
		d := a.dirs[i]
		if err := lutimes(d.path, d.atime, d.mtime); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("set times on %s: %w", d.path, err)
		}
	}
	if times != nil {
		for _, d := range a.dirs { // in order: a later entry's times win
			times[d.path] = d
		}
	}
	return nil
}

type applier struct {
	root  string
	opts  *Options
	chown bool
	// written holds the cleaned paths created by this layer and all their
	// ancestors, so an opaque whiteout keeps this layer's own entries.
	written map[string]bool
	dirs    []dirTime
}

// cleanName turns a tar entry name into a clean relative slash path ("."
// for the root), refusing absolute names and names that climb out.
func cleanName(n string) (string, error) {
	if n == "" {
		return "", fmt.Errorf("empty entry name: %w", ErrUnsafePath)
	}
	if strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("absolute entry name %q: %w", n, ErrUnsafePath)
	}
	if strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("entry name %q contains NUL: %w", n, ErrUnsafePath)
	}
	p := path.Clean(n)
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("entry name %q leaves the root: %w", n, ErrUnsafePath)
	}
	return p, nil
}

func (a *applier) markWritten(rel string) {
	for p := rel; p != "." && p != "/" && !a.written[p]; p = path.Dir(p) {
		a.written[p] = true
	}
}

// parent resolves the directory that holds rel, with symlinks in it scoped
// to the root, creating missing directories (0755) when create is set.
func (a *applier) parent(rel string, create bool) (string, error) {
	dir := path.Dir(rel)
	p, err := securejoin.SecureJoin(a.root, filepath.FromSlash(dir))
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", dir, err)
	}
	if !strings.HasPrefix(p+"/", a.root+"/") {
		return "", fmt.Errorf("parent of %q resolves outside the root: %w", rel, ErrUnsafePath)
	}
	if create {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return "", fmt.Errorf("create parent of %s: %w", rel, err)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		if !fi.IsDir() {
			return "", fmt.Errorf("parent of %s is not a directory", rel)
		}
	}
	return p, nil
}

func (a *applier) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	base := path.Base(rel)

	// Whiteouts.
	if strings.HasPrefix(base, whiteoutPrefix) {
		par, err := a.parent(rel, false)
		if err != nil {
			return err
		}
		switch {
		case base == whiteoutOpaque:
			return a.opaque(par, path.Dir(rel))
		case strings.HasPrefix(base, whiteoutMeta):
			a.opts.note("skipped whiteout metadata entry %s", rel)
			return nil
		}
		victim := strings.TrimPrefix(base, whiteoutPrefix)
		if victim == "" || victim == "." || victim == ".." || strings.Contains(victim, "/") {
			return fmt.Errorf("bad whiteout %q: %w", hdr.Name, ErrUnsafePath)
		}
		if err := os.RemoveAll(filepath.Join(par, victim)); err != nil && !errors.Is(err, unix.ENOTDIR) {
			return fmt.Errorf("whiteout %s: %w", rel, err)
		}
		return nil
	}

	if rel == "." {
		// The root directory itself: only its metadata.
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("entry %q for the root is not a directory: %w", hdr.Name, ErrUnsafePath)
		}
		return a.meta(a.root, hdr)
	}

	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		a.opts.note("skipped device node %s (%c %d:%d)", rel, hdr.Typeflag, hdr.Devmajor, hdr.Devminor)
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeRegA, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		a.opts.note("skipped %s: unsupported tar entry type %q", rel, hdr.Typeflag)
		return nil
	}

	par, err := a.parent(rel, true)
	if err != nil {
		return err
	}
	target := filepath.Join(par, base)

	// Hard-link source: resolved like any entry, final component not
	// followed.
	var linkSrc string
	if hdr.Typeflag == tar.TypeLink {
		lrel, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link %s: %w", rel, err)
		}
		if lrel == "." {
			return fmt.Errorf("hard link %s to the root: %w", rel, ErrUnsafePath)
		}
		lpar, err := a.parent(lrel, false)
		if err != nil {
			return fmt.Errorf("hard link %s: %w", rel, err)
		}
		linkSrc = filepath.Join(lpar, path.Base(lrel))
		fi, err := os.Lstat(linkSrc)
		if err != nil {
			return fmt.Errorf("hard link %s -> %s: %w", rel, hdr.Linkname, err)
		}
		if fi.IsDir() {
			return fmt.Errorf("hard link %s -> %s: target is a directory", rel, hdr.Linkname)
		}
		if linkSrc == target {
			a.markWritten(rel)
			return nil
		}
	}

	// Replace what is there, without following it.
	if fi, err := os.Lstat(target); err == nil {
		if !(fi.IsDir() && hdr.Typeflag == tar.TypeDir) {
			if err := os.RemoveAll(target); err != nil {
				return fmt.Errorf("replace %s: %w", rel, err)
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	a.markWritten(rel)

	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	case tar.TypeReg, tar.TypeRegA:
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create %s: %w", rel, err)
		}
		// Holes stay holes: a sparse entry or a file of zeros takes no
		// disk here.
		if _, err := copySparse(f, r); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", rel, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("write %s: %w", rel, err)
		}
	case tar.TypeSymlink:
		// The link text is stored as is; it is only ever resolved inside
		// the guest, or scoped to the root here.
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return fmt.Errorf("symlink %s: %w", rel, err)
		}
	case tar.TypeLink:
		if err := os.Link(linkSrc, target); err != nil {
			return fmt.Errorf("hard link %s -> %s: %w", rel, hdr.Linkname, err)
		}
		return nil // shares the source's inode and metadata
	case tar.TypeFifo:
		if err := unix.Mkfifo(target, 0o600); err != nil {
			return fmt.Errorf("mkfifo %s: %w", rel, err)
		}
	}
	return a.meta(target, hdr)
}

// meta applies ownership, mode (including setuid/setgid/sticky), xattrs and
// times from hdr to p, which is not followed if it is a symlink.
func (a *applier) meta(p string, hdr *tar.Header) error {
	if a.chown {
		if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown %s: %w", p, err)
		}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// After chown, which clears setuid/setgid.
		m := hdr.FileInfo().Mode()
		if err := os.Chmod(p, m&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return fmt.Errorf("chmod %s: %w", p, err)
		}
	}
	var keys []string
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		x := strings.TrimPrefix(k, "SCHILY.xattr.")
		if !strings.HasPrefix(x, "user.") && !strings.HasPrefix(x, "security.") {
			a.opts.note("skipped xattr %s on %s (only user.* and security.* are applied)", x, p)
			continue
		}
		if err := unix.Lsetxattr(p, x, []byte(hdr.PAXRecords[k]), 0); err != nil {
			a.opts.note("could not set xattr %s on %s: %v", x, p, err)
		}
	}
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	if hdr.Typeflag == tar.TypeDir {
		a.dirs = append(a.dirs, dirTime{p, at, hdr.ModTime})
		return nil
	}
	if err := lutimes(p, at, hdr.ModTime); err != nil {
		return fmt.Errorf("set times on %s: %w", p, err)
	}
	return nil
}

// opaque empties the directory dirRel (resolved to par) of everything that
// did not come from the current layer.
func (a *applier) opaque(par, dirRel string) error {
	ents, err := os.ReadDir(par)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opaque %s: %w", dirRel, err)
	}
	for _, e := range ents {
		if a.written[path.Join(dirRel, e.Name())] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(par, e.Name())); err != nil {
			return fmt.Errorf("opaque %s: %w", dirRel, err)
		}
	}
	a.markWritten(dirRel)
	return nil
}

func lutimes(p string, atime, mtime time.Time) error {
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Sec: 0, Nsec: unix.UTIME_OMIT}
	}
	return unix.NsecToTimespec(t.UnixNano())
}
