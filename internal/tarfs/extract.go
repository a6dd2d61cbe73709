//go:build linux

package tarfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ExtractOptions tune Extract.
type ExtractOptions struct {
	// Rename gives the archive's top-level entry From the name To: entries
	// "From" and "From/x" become "To" and "To/x". To "." puts From's
	// contents straight into the destination directory (From's own
	// metadata is then not applied); To "" keeps the name. With From set
	// (other than "."), the archive may hold nothing else: an entry that
	// is not From or under From/ (or a hard link to one) is an error that
	// names it, and the extraction stops there. From "" accepts any entry
	// and renames nothing; From "." (an archive of a root directory)
	// accepts any entry and puts it under To.
	RenameFrom, RenameTo string
	// Owners applies the archive's uid/gid to what is created; with
	// UID/GID >= 0 every entry gets that owner instead. Without Owners and
	// with UID/GID < 0, entries belong to whoever extracts.
	Owners   bool
	UID, GID int
	// AllowDevices lets the archive create device nodes, FIFOs and
	// sockets; without it such entries are an error.
	AllowDevices bool
	// AllowSetuid keeps setuid/setgid bits; without it they are cleared.
	AllowSetuid bool
	// MaxBytes bounds the total size of the files' contents; 0: no bound.
	MaxBytes int64
	// MaxEntries bounds the number of entries; 0: no bound.
	MaxEntries int
}

// Stats counts what Extract wrote.
type Stats struct {
	Entries int
	Bytes   int64
}

// cleanName checks an archive entry name: relative, no "..", and returns
// it cleaned ("." for the top directory itself).
func cleanName(n string) (string, error) {
	if n == "" {
		return "", errors.New("empty entry name")
	}
	if strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("entry %q is absolute: refused", n)
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", fmt.Errorf("entry %q climbs out with '..': refused", n)
		}
		if strings.IndexByte(c, 0) >= 0 {
			return "", fmt.Errorf("entry %q has a NUL byte: refused", n)
		}
	}
	return path.Clean(n), nil
}

// rename maps entry n (cleaned) to its name in the destination; ok is
// false for an entry outside RenameFrom.
func (o *ExtractOptions) rename(n string) (string, bool) {
	if o.RenameFrom == "" {
		return n, true
	}
	if o.RenameFrom == "." {
		// An archive of a root directory: every entry is under ".".
		return path.Join(o.RenameTo, n), true
	}
	to := o.RenameTo
	if to == "" {
		to = o.RenameFrom
	}
	switch {
	case n == o.RenameFrom:
		if to == "." {
			return ".", true
		}
		return to, true
	case strings.HasPrefix(n, o.RenameFrom+"/"):
		return path.Join(to, n[len(o.RenameFrom)+1:]), true
	}
	return "", false
}

// outside is the error for an entry that is not under RenameFrom.
func (o *ExtractOptions) outside(what, n string) error {
	return fmt.Errorf("%s %q is outside the archive's top entry %q: refused (nothing is written outside the destination)", what, n, o.RenameFrom)
}

type dirMeta struct {
	p        string
	mode     uint32
	uid, gid int
	mtime    time.Time
}

// Extract unpacks the tar stream src into directory dir (a path in the
// root, which must exist). Each regular file, symlink and hard link is
// created under a temporary name and renamed into place. Directory modes
// and times are applied at the end. Every error names the entry's path.
//
// When the top entry is renamed to a name that does not exist yet, the
// whole tree is extracted under a temporary name and renamed into place at
// the end: a failed copy then leaves nothing at all.
func (r *Root) Extract(dir string, src io.Reader, o ExtractOptions) (stats Stats, err error) {
	fi, err := r.Stat(dir, true)
	if err != nil {
		return stats, err
	}
	if !fi.Mode.IsDir() {
		return stats, &fs.PathError{Op: "extract", Path: dir, Err: unix.ENOTDIR}
	}
	dir = path.Clean("/" + dir)
	if o.RenameFrom != "" && o.RenameTo != "" && o.RenameTo != "." && !strings.Contains(o.RenameTo, "/") {
		final := path.Join(dir, o.RenameTo)
		if _, serr := r.Stat(final, false); errors.Is(serr, fs.ErrNotExist) {
			tmp := tempName()
			o.RenameTo = tmp
			defer func() {
				tp := path.Join(dir, tmp)
				if err == nil {
					var pfd int
					var base string
					pfd, base, err = r.Parent(tp)
					if err == nil {
						err = unix.Renameat2(pfd, base, pfd, path.Base(final), unix.RENAME_NOREPLACE)
						unix.Close(pfd)
						if err != nil {
							err = &fs.PathError{Op: "rename", Path: final, Err: err}
						}
					}
				}
				if err != nil {
					r.Remove(tp)
				}
			}()
		}
	}
	tr := tar.NewReader(src)
	var dirs []dirMeta
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return stats, fmt.Errorf("reading archive: %w", err)
		}
		stats.Entries++
		if o.MaxEntries > 0 && stats.Entries > o.MaxEntries {
			return stats, fmt.Errorf("archive has more than %d entries: refused", o.MaxEntries)
		}
		name, err := cleanName(h.Name)
		if err != nil {
			return stats, err
		}
		name, ok := o.rename(name)
		if !ok {
			return stats, o.outside("entry", h.Name)
		}
		if name == "." {
			continue // the destination directory itself
		}
		p := path.Join(dir, name)
		uid, gid := -1, -1
		if o.Owners {
			uid, gid = h.Uid, h.Gid
		}
		if o.UID >= 0 {
			uid = o.UID
		}
		if o.GID >= 0 {
			gid = o.GID
		}
		mode := uint32(h.Mode) & 0o7777
		if !o.AllowSetuid {
			mode &^= unix.S_ISUID | unix.S_ISGID
			if h.Typeflag == tar.TypeDir {
				mode = uint32(h.Mode) & 0o3777 // setgid on directories is harmless
			}
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := r.mkdirEntry(p); err != nil {
				return stats, err
			}
			dirs = append(dirs, dirMeta{p, mode, uid, gid, h.ModTime})
		case tar.TypeReg, tar.TypeRegA:
			if o.MaxBytes > 0 && stats.Bytes+h.Size > o.MaxBytes {
				return stats, &fs.PathError{Op: "extract", Path: p, Err: fmt.Errorf("%w (%d bytes)", errTooLarge, o.MaxBytes)}
			}
			pfd, base, err := r.Parent(p)
			if err != nil {
				return stats, err
			}
			mt := h.ModTime
			n, err := writeAt(pfd, base, p, tr, mode, uid, gid, &mt)
			unix.Close(pfd)
			if err != nil {
				return stats, err
			}
			stats.Bytes += n
		case tar.TypeSymlink:
			pfd, base, err := r.Parent(p)
			if err != nil {
				return stats, err
			}
			err = placeAt(pfd, base, p, func(tmp string) error {
				if err := unix.Symlinkat(h.Linkname, pfd, tmp); err != nil {
					return err
				}
				if uid >= 0 || gid >= 0 {
					if err := unix.Fchownat(pfd, tmp, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
						return err
					}
				}
				ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
				return unix.UtimesNanoAt(pfd, tmp, ts, unix.AT_SYMLINK_NOFOLLOW)
			})
			unix.Close(pfd)
			if err != nil {
				return stats, err
			}
		case tar.TypeLink:
			target, err := cleanName(h.Linkname)
			if err != nil {
				return stats, fmt.Errorf("hard link %s: %w", p, err)
			}
			target, ok := o.rename(target)
			if !ok || target == "." {
				return stats, fmt.Errorf("hard link %s: %w", p, o.outside("link target", h.Linkname))
			}
			tp := path.Join(dir, target)
			tfd, tbase, err := r.Parent(tp)
			if err != nil {
				return stats, err
			}
			pfd, base, err := r.Parent(p)
			if err != nil {
				unix.Close(tfd)
				return stats, err
			}
			err = placeAt(pfd, base, p, func(tmp string) error {
				return unix.Linkat(tfd, tbase, pfd, tmp, 0)
			})
			unix.Close(tfd)
			unix.Close(pfd)
			if err != nil {
				return stats, err
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			if !o.AllowDevices {
				return stats, &fs.PathError{Op: "extract", Path: p, Err: errors.New("device node or FIFO in the archive: refused (not allowed for this copy)")}
			}
			typ := uint32(unix.S_IFIFO)
			switch h.Typeflag {
			case tar.TypeChar:
				typ = unix.S_IFCHR
			case tar.TypeBlock:
				typ = unix.S_IFBLK
			}
			pfd, base, err := r.Parent(p)
			if err != nil {
				return stats, err
			}
			err = placeAt(pfd, base, p, func(tmp string) error {
				if err := unix.Mknodat(pfd, tmp, typ|mode, int(unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor)))); err != nil {
					return err
				}
				if uid >= 0 || gid >= 0 {
					return unix.Fchownat(pfd, tmp, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
				}
				return nil
			})
			unix.Close(pfd)
			if err != nil {
				return stats, err
			}
		case tar.TypeXGlobalHeader:
		default:
			return stats, &fs.PathError{Op: "extract", Path: p, Err: fmt.Errorf("unsupported tar entry type %q", h.Typeflag)}
		}
	}
	// Deepest first, so a read-only parent is made read-only last.
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		pfd, base, err := r.Parent(d.p)
		if err != nil {
			return stats, err
		}
		if d.uid >= 0 || d.gid >= 0 {
			if err := unix.Fchownat(pfd, base, d.uid, d.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				unix.Close(pfd)
				return stats, &fs.PathError{Op: "chown", Path: d.p, Err: err}
			}
		}
		if err := unix.Fchmodat(pfd, base, d.mode, 0); err != nil {
			unix.Close(pfd)
			return stats, &fs.PathError{Op: "chmod", Path: d.p, Err: err}
		}
		ts := []unix.Timespec{unix.NsecToTimespec(d.mtime.UnixNano()), unix.NsecToTimespec(d.mtime.UnixNano())}
		err = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
		unix.Close(pfd)
		if err != nil {
			return stats, &fs.PathError{Op: "chtimes", Path: d.p, Err: err}
		}
	}
	return stats, nil
}

// mkdirEntry creates directory p unless a directory is already there.
func (r *Root) mkdirEntry(p string) error {
	pfd, base, err := r.Parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	err = unix.Mkdirat(pfd, base, 0o700)
	if err == nil {
		return nil
	}
	if err != unix.EEXIST {
		return &fs.PathError{Op: "mkdir", Path: p, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "mkdir", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return &fs.PathError{Op: "mkdir", Path: p, Err: fmt.Errorf("cannot overwrite non-directory with a directory: %w", unix.ENOTDIR)}
	}
	return nil
}

// placeAt creates an entry under a temporary name with create, then renames
// it to base in dirfd.
func placeAt(dirfd int, base, p string, create func(tmp string) error) error {
	tmp := tempName()
	if err := create(tmp); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return &fs.PathError{Op: "create", Path: p, Err: err}
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		if err == unix.EISDIR || err == unix.ENOTEMPTY || err == unix.EEXIST {
			err = fmt.Errorf("cannot overwrite directory: %w", unix.EISDIR)
		}
		return &fs.PathError{Op: "create", Path: p, Err: err}
	}
	return nil
}
