// Package sparse copies disk images as sparse files: the holes of the
// source stay holes in the copy. The box lifecycle (internal/rootfs: a new
// writable layer from its template) and the VM drivers (a snapshot's copy
// of a writable layer) use it; it imports nothing of the module. Its
// CopyFile is the plain copy of other files (the fake driver's snapshot
// of a box's files, a test home's copy of the image store).
package sparse

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Copy copies the file src (a disk image) to a new file dst, refusing to
// overwrite one: src's holes stay holes, and the filesystem may share
// blocks where it can (copy_file_range: a reflink on btrfs and XFS; other
// filesystems, and copies across filesystems, fall back to reads and
// writes). dst gets mode 0600. A partial dst is removed on failure; a full
// filesystem gives an error that says so (wrapping ENOSPC or EDQUOT).
func Copy(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	size := fi.Size()
	kernelCopy := true
	if err := out.Truncate(size); err != nil {
		return fmt.Errorf("create disk: %w", err)
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // only a hole left
		}
		if err != nil {
			return fmt.Errorf("copy disk: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("copy disk: %w", err)
		}
		if err := copyRange(in, out, data, hole, &kernelCopy); err != nil {
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
				return fmt.Errorf("copy disk: the filesystem of %s is full (%w): free some space there, or put the airlock home elsewhere", filepath.Dir(dst), err)
			}
			return fmt.Errorf("copy disk: %w", err)
		}
		off = hole
	}
	return nil
}

// copyRange copies bytes [from, to) of in to the same offsets of out:
// with copy_file_range while *kernel, else (other filesystems, which
// copy_file_range refuses with EXDEV, or a kernel without it) with
// reads and writes, setting *kernel to false.
func copyRange(in, out *os.File, from, to int64, kernel *bool) error {
	for r, w := from, from; *kernel && r < to; {
		n, err := unix.CopyFileRange(int(in.Fd()), &r, int(out.Fd()), &w, int(to-r), 0)
		switch {
		case errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL):
			*kernel = false
			from = r
		case err != nil:
			return err
		case n == 0:
			return fmt.Errorf("%s shrank while copying", in.Name())
		}
	}
	if *kernel {
		return nil
	}
	buf := make([]byte, 1<<20)
	for off := from; off < to; {
		n, err := in.ReadAt(buf[:min(int64(len(buf)), to-off)], off)
		if n > 0 {
			if _, werr := out.WriteAt(buf[:n], off); werr != nil {
				return werr
			}
			off += int64(n)
		}
		if err != nil && off < to {
			if err == io.EOF {
				return fmt.Errorf("%s shrank while copying", in.Name())
			}
			return err
		}
	}
	return nil
}

// Allocated returns the bytes file p takes on disk (its allocated blocks:
// a sparse disk image counts what it holds, not its size); 0 if p cannot
// be read.
func Allocated(p string) int64 {
	var s unix.Stat_t
	if unix.Stat(p, &s) != nil {
		return 0
	}
	return s.Blocks * 512
}

// AllocatedTree returns the bytes the files under dir take on disk
// (Allocated of each; what cannot be read counts 0).
func AllocatedTree(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// CopyFile copies the regular file src to dst, a new file (an existing
// dst is an error) of permission perm, byte for byte (holes are not
// kept: for disk images use Copy).
func CopyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
