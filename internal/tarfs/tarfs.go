//go:build linux

// Package tarfs moves directory trees in and out of a directory as tar
// streams without ever letting a path escape it. It is used on both sides of
// a box: the guest agent resolves paths inside the box root
// (openat2 RESOLVE_IN_ROOT, so a symlink in the box cannot redirect a copy
// anywhere else in the guest), and the host extracts what a box sends
// beneath the destination with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, so an
// archive's own symlinks are never followed. Every file is written to a
// temporary name and renamed into place, so a failed copy leaves no
// half-written file behind.
package tarfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
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

// Resolve modes for Root.
const (
	// InRoot resolves paths as if the root were "/": symlinks are followed
	// but cannot leave it (the guest's view of a box).
	InRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
	// Beneath refuses any path that leaves the root or crosses a symlink
	// (the host's view of a copy-out destination).
	Beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS
)

// Root is a directory that paths are resolved in.
type Root struct {
	fd      int
	resolve uint64
	name    string // for messages
}

// OpenRoot opens dir as a root resolving paths with resolve (InRoot or
// Beneath). Close it when done.
func OpenRoot(dir string, resolve uint64) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return &Root{fd: fd, resolve: resolve, name: dir}, nil
}

// Close releases the root.
func (r *Root) Close() error { return unix.Close(r.fd) }

// rel turns p into a path relative to the root ("." for the root itself).
func rel(p string) string {
	p = path.Clean("/" + p)
	if p == "/" {
		return "."
	}
	return p[1:]
}

// Open opens p (resolved in the root; a final symlink is followed when
// follow is set) with flags.
func (r *Root) Open(p string, flags int, follow bool) (int, error) {
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	for {
		fd, err := unix.Openat2(r.fd, rel(p), &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: r.resolve})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return -1, err
		}
		return fd, nil
	}
}

// OpenFile opens p as an *os.File (following a final symlink inside the
// root), for reading or writing.
func (r *Root) OpenFile(p string, flags int) (*os.File, error) {
	fd, err := r.Open(p, flags, true)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// Parent opens p's parent directory (O_PATH) and returns it with p's last
// component. The root itself has no parent: it is an error.
func (r *Root) Parent(p string) (int, string, error) {
	rp := rel(p)
	if rp == "." {
		return -1, "", &fs.PathError{Op: "resolve", Path: p, Err: errors.New("is the root directory")}
	}
	dir, base := path.Split(rp)
	if dir == "" {
		dir = "."
	}
	fd, err := r.Open(dir, unix.O_PATH|unix.O_DIRECTORY, true)
	if err != nil {
		return -1, "", &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return fd, base, nil
}

// Info describes one file (lstat of the final component unless followed).
type Info struct {
	Name    string
	Size    int64
	Mode    fs.FileMode
	ModTime time.Time
	UID     int
	GID     int
	Link    string // symlink target
	Nlink   uint64
}

// FileMode converts a unix st_mode to an fs.FileMode.
func FileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// unixPerm converts the permission and special bits of an fs.FileMode.
func unixPerm(m fs.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		p |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		p |= unix.S_ISVTX
	}
	return p
}

func infoOf(name string, st *unix.Stat_t, link string) Info {
	return Info{
		Name: name, Size: st.Size, Mode: FileMode(st.Mode),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec), UID: int(st.Uid), GID: int(st.Gid),
		Link: link, Nlink: uint64(st.Nlink),
	}
}

// Stat returns p's information; follow follows a final symlink (inside the
// root).
func (r *Root) Stat(p string, follow bool) (Info, error) {
	fd, err := r.Open(p, unix.O_PATH, follow)
	if err != nil {
		return Info{}, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Info{}, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	link := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		link, _ = readlinkat(fd, "")
	}
	return infoOf(path.Base(path.Clean("/"+p)), &st, link), nil
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// ReadDir lists directory p (following symlinks inside the root), sorted by
// name, calling fn for each entry (lstat).
func (r *Root) ReadDir(p string, fn func(Info) error) error {
	fd, err := r.Open(p, unix.O_RDONLY|unix.O_DIRECTORY, true)
	if err != nil {
		return &fs.PathError{Op: "readdir", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return &fs.PathError{Op: "readdir", Path: p, Err: err}
	}
	sort.Strings(names)
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		link := ""
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			link, _ = readlinkat(fd, n)
		}
		if err := fn(infoOf(n, &st, link)); err != nil {
			return err
		}
	}
	return nil
}

// MkdirAll creates directory p and its missing parents with perm.
func (r *Root) MkdirAll(p string, perm fs.FileMode) error {
	parts := strings.Split(rel(p), "/")
	cur := ""
	for _, c := range parts {
		if c == "." {
			continue
		}
		next := path.Join(cur, c)
		pfd, base, err := r.Parent(next)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(pfd, base, uint32(perm.Perm()))
		unix.Close(pfd)
		if err != nil && err != unix.EEXIST {
			return &fs.PathError{Op: "mkdir", Path: "/" + next, Err: err}
		}
		cur = next
	}
	fi, err := r.Stat(p, true)
	if err != nil {
		return err
	}
	if !fi.Mode.IsDir() {
		return &fs.PathError{Op: "mkdir", Path: p, Err: unix.ENOTDIR}
	}
	return nil
}

// Remove removes p; a directory is removed with everything in it. A final
// symlink is removed, not followed.
func (r *Root) Remove(p string) error {
	pfd, base, err := r.Parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return removeAt(pfd, base, p)
}

func removeAt(dirfd int, name, p string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil {
		return nil
	}
	if err != unix.EISDIR {
		return &fs.PathError{Op: "remove", Path: p, Err: err}
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "remove", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	names, err := f.Readdirnames(-1)
	if err != nil {
		f.Close()
		return &fs.PathError{Op: "remove", Path: p, Err: err}
	}
	for _, n := range names {
		if err := removeAt(fd, n, path.Join(p, n)); err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil {
		return &fs.PathError{Op: "remove", Path: p, Err: err}
	}
	return nil
}

// tempName returns a fresh temporary name for a file being written.
func tempName() string {
	var b [8]byte
	rand.Read(b[:])
	return ".airlock-tmp-" + hex.EncodeToString(b[:])
}

// WriteFile writes r to p atomically: to a temporary file in p's directory,
// renamed over p when complete (a symlink at p is replaced, not followed).
// uid/gid < 0 leave the owner as created.
func (r *Root) WriteFile(p string, src io.Reader, perm fs.FileMode, uid, gid int) (int64, error) {
	pfd, base, err := r.Parent(p)
	if err != nil {
		return 0, err
	}
	defer unix.Close(pfd)
	return writeAt(pfd, base, p, src, unixPerm(perm), uid, gid, nil)
}

func writeAt(pfd int, base, p string, src io.Reader, mode uint32, uid, gid int, mtime *time.Time) (int64, error) {
	tmp := tempName()
	fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, &fs.PathError{Op: "create", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	fail := func(op string, err error) (int64, error) {
		f.Close()
		unix.Unlinkat(pfd, tmp, 0)
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return 0, &fs.PathError{Op: op, Path: p, Err: err}
	}
	// Large writes: under TCG every system call is expensive.
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, struct{ io.Reader }{src}, make([]byte, 1<<20))
	if err != nil {
		return fail("write", err)
	}
	if uid >= 0 || gid >= 0 {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return fail("chown", err)
		}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fail("chmod", err)
	}
	if mtime != nil {
		ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
		if err := unix.UtimesNanoAt(pfd, tmp, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fail("chtimes", err)
		}
	}
	if err := f.Close(); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return 0, &fs.PathError{Op: "write", Path: p, Err: err}
	}
	if err := unix.Renameat(pfd, tmp, pfd, base); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		if err == unix.EISDIR || err == unix.ENOTEMPTY || err == unix.EEXIST {
			return 0, &fs.PathError{Op: "write", Path: p, Err: fmt.Errorf("cannot overwrite directory with a file: %w", unix.EISDIR)}
		}
		return 0, &fs.PathError{Op: "rename", Path: p, Err: err}
	}
	return n, nil
}

// pathErr says which path of which operation failed, for errors that
// are not already *fs.PathError.
func pathErr(op, p string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	return &fs.PathError{Op: op, Path: p, Err: err}
}

var errTooLarge = errors.New("archive exceeds the size limit")

// ErrTooLarge is returned when an archive exceeds ExtractOptions.MaxBytes.
var ErrTooLarge = errTooLarge
