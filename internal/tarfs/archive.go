//go:build linux

package tarfs

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ArchiveOptions tune Archive.
type ArchiveOptions struct {
	// Name is the top entry's name in the archive; default p's base name.
	Name string
	// FollowTop follows p itself when it is a symlink (inside the root);
	// symlinks below it are always archived as symlinks.
	FollowTop bool
}

type inode struct{ dev, ino uint64 }

type archiver struct {
	tw    *tar.Writer
	links map[inode]string
	p     string
}

// Archive writes p (in the root) and, for a directory, everything below it
// as a tar stream to w: entries are named Name, Name/x, ...; modes, owners,
// times, symlinks and hard links (within the tree) are kept. It calls top
// with the top entry's information before any data is written, so a caller
// can fail early (missing source) without a stream.
func (r *Root) Archive(p string, w io.Writer, o ArchiveOptions, top func(Info) error) error {
	var pfd int
	var base string
	if rel(p) == "." || o.FollowTop {
		// Resolve p itself (following it inside the root): its parent is
		// then p, reached as ".".
		fd, err := r.Open(p, unix.O_PATH, true)
		if err != nil {
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		pfd, base = fd, "."
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			// A file: "." does not work on it; go through its parent.
			unix.Close(fd)
			real, err := r.realPath(p)
			if err != nil {
				return err
			}
			pfd, base, err = r.Parent(real)
			if err != nil {
				return err
			}
		}
	} else {
		var err error
		pfd, base, err = r.Parent(p)
		if err != nil {
			return err
		}
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	name := o.Name
	if name == "" {
		name = path.Base(path.Clean("/" + p))
		if name == "/" {
			name = "."
		}
	}
	link := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		link, _ = readlinkat(pfd, base)
	}
	if top != nil {
		if err := top(infoOf(name, &st, link)); err != nil {
			return err
		}
	}
	a := &archiver{tw: tar.NewWriter(w), links: map[inode]string{}, p: path.Clean("/" + p)}
	if err := a.add(pfd, base, &st, name, a.p, link); err != nil {
		return err
	}
	return a.tw.Close()
}

// realPath returns where p leads inside the root, symlinks resolved, by
// following its final symlinks one at a time (bounded).
func (r *Root) realPath(p string) (string, error) {
	cur := path.Clean("/" + p)
	for i := 0; i < 40; i++ {
		fi, err := r.Stat(cur, false)
		if err != nil {
			return "", err
		}
		if fi.Mode&fs.ModeSymlink == 0 {
			return cur, nil
		}
		if path.IsAbs(fi.Link) {
			cur = path.Clean(fi.Link)
		} else {
			cur = path.Join(path.Dir(cur), fi.Link)
		}
	}
	return "", &fs.PathError{Op: "open", Path: p, Err: unix.ELOOP}
}

// add archives entry base of directory dirfd (lstat st), named name in the
// archive.
func (a *archiver) add(dirfd int, base string, st *unix.Stat_t, name, p, link string) error {
	h := &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:  tar.FormatPAX,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag = tar.TypeDir
		h.Name = strings.TrimSuffix(name, "/") + "/"
		if err := a.tw.WriteHeader(h); err != nil {
			return err
		}
		dfd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		f := os.NewFile(uintptr(dfd), p)
		defer f.Close()
		names, err := f.Readdirnames(-1)
		if err != nil {
			return &fs.PathError{Op: "readdir", Path: p, Err: err}
		}
		sort.Strings(names)
		for _, n := range names {
			var cst unix.Stat_t
			if err := unix.Fstatat(dfd, n, &cst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if err == unix.ENOENT {
					continue // removed meanwhile
				}
				return &fs.PathError{Op: "stat", Path: path.Join(p, n), Err: err}
			}
			clink := ""
			if cst.Mode&unix.S_IFMT == unix.S_IFLNK {
				clink, _ = readlinkat(dfd, n)
			}
			if err := a.add(dfd, n, &cst, path.Join(name, n), path.Join(p, n), clink); err != nil {
				return err
			}
		}
		return nil
	case unix.S_IFLNK:
		h.Typeflag = tar.TypeSymlink
		h.Linkname = link
		return a.tw.WriteHeader(h)
	case unix.S_IFREG:
		if st.Nlink > 1 {
			k := inode{st.Dev, st.Ino}
			if first, ok := a.links[k]; ok {
				h.Typeflag = tar.TypeLink
				h.Linkname = first
				return a.tw.WriteHeader(h)
			}
			a.links[k] = name
		}
		h.Typeflag = tar.TypeReg
		rfd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		f := os.NewFile(uintptr(rfd), p)
		defer f.Close()
		var now unix.Stat_t
		if err := unix.Fstat(rfd, &now); err != nil || now.Ino != st.Ino || now.Dev != st.Dev {
			return &fs.PathError{Op: "open", Path: p, Err: fmt.Errorf("file replaced while being copied")}
		}
		h.Size = now.Size
		if err := a.tw.WriteHeader(h); err != nil {
			return err
		}
		n, err := io.CopyN(a.tw, f, h.Size)
		if err != nil {
			if err == io.EOF {
				return &fs.PathError{Op: "read", Path: p, Err: fmt.Errorf("file shrank while being copied (%d of %d bytes)", n, h.Size)}
			}
			return pathErr("read", p, err)
		}
		return nil
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			h.Typeflag = tar.TypeChar
		case unix.S_IFBLK:
			h.Typeflag = tar.TypeBlock
		default:
			h.Typeflag = tar.TypeFifo
		}
		h.Devmajor = int64(unix.Major(st.Rdev))
		h.Devminor = int64(unix.Minor(st.Rdev))
		return a.tw.WriteHeader(h)
	}
	// Sockets cannot be archived; skip them as tar does.
	return nil
}
