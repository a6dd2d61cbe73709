package unpack

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"
)

// ErrLimit is wrapped by the error of an image that exceeds one of
// Limits; the message names the limit, the entry and how to raise it.
var ErrLimit = errors.New("image exceeds an unpack limit")

// Limits bound what unpacking an image may write, so that a hostile image (a
// sparse entry declaring a petabyte, a layer of compressed zeros, millions
// of empty files) fails fast instead of filling the disk or its inodes. A
// zero field takes its default from the free space of the filesystem
// unpacked into (DefaultLimits); a negative one means no limit.
type Limits struct {
	// MaxBytes bounds the sum of the sizes of all regular files of all
	// layers (as declared: holes count, since the root filesystem image
	// made from the tree holds them). Default: half the free space less a
	// 1 GiB reserve (the other half is for the image built from the tree).
	MaxBytes int64
	// MaxFileSize bounds one regular file. Default: MaxBytes.
	MaxFileSize int64
	// MaxEntries bounds the number of tar entries of all layers. Default:
	// half the free inodes, at most 4 million (1 million where the
	// filesystem does not count inodes).
	MaxEntries int64
}

// reserve is disk space a default MaxBytes leaves free.
const reserve = 1 << 30

// DefaultLimits returns the limits for unpacking into dir, from its
// filesystem's free space and inodes (see Limits).
func DefaultLimits(dir string) Limits {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Limits{MaxBytes: -1, MaxFileSize: -1, MaxEntries: 1 << 20}
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	l := Limits{MaxBytes: max((free-reserve)/2, 0)}
	l.MaxFileSize = l.MaxBytes
	switch {
	case st.Files == 0: // no inode accounting (btrfs, some tmpfs)
		l.MaxEntries = 1 << 20
	default:
		l.MaxEntries = min(int64(st.Ffree)/2, 4<<20)
	}
	return l
}

// withDefaults fills zero fields from DefaultLimits(dir).
func (l Limits) withDefaults(dir string) Limits {
	if l.MaxBytes != 0 && l.MaxFileSize != 0 && l.MaxEntries != 0 {
		return l
	}
	d := DefaultLimits(dir)
	if l.MaxBytes == 0 {
		l.MaxBytes = d.MaxBytes
	}
	if l.MaxFileSize == 0 {
		l.MaxFileSize = l.MaxBytes
		if l.MaxFileSize < 0 {
			l.MaxFileSize = d.MaxFileSize
		}
	}
	if l.MaxEntries == 0 {
		l.MaxEntries = d.MaxEntries
	}
	return l
}

// budget is what is left of Limits while an image is unpacked.
type budget struct {
	lim     Limits
	bytes   int64
	entries int64
}

func newBudget(l Limits, dir string) *budget { return &budget{lim: l.withDefaults(dir)} }

func size(n int64) string { return humanize.IBytes(uint64(max(n, 0))) }

// entry charges one entry of the given declared size (0 for non-files).
func (b *budget) entry(name string, fileSize int64) error {
	b.entries++
	if b.lim.MaxEntries > 0 && b.entries > b.lim.MaxEntries {
		return fmt.Errorf("%w: more than %d entries (MaxEntries, from the free inodes; raise it in the unpack limits): stopped at %s", ErrLimit, b.lim.MaxEntries, name)
	}
	if fileSize < 0 {
		return fmt.Errorf("%w: entry %s declares a negative size", ErrLimit, name)
	}
	if b.lim.MaxFileSize > 0 && fileSize > b.lim.MaxFileSize {
		return fmt.Errorf("%w: entry %s declares %s, over the per-file limit of %s (MaxFileSize, from the free space; raise it in the unpack limits)", ErrLimit, name, size(fileSize), size(b.lim.MaxFileSize))
	}
	b.bytes += fileSize
	if b.lim.MaxBytes > 0 && b.bytes > b.lim.MaxBytes {
		return fmt.Errorf("%w: files total more than %s at %s (MaxBytes, from the free space; raise it in the unpack limits, or free disk space)", ErrLimit, size(b.lim.MaxBytes), name)
	}
	return nil
}

// copySparse copies r to f, leaving runs of zeros as holes (seeking over
// them) so that sparse entries and zero-filled files take no disk; the file
// is then truncated to its full length. It returns the bytes copied.
func copySparse(f *os.File, r io.Reader) (int64, error) {
	buf := make([]byte, 64<<10)
	var n int64
	hole := false
	for {
		m, err := io.ReadFull(r, buf)
		if m > 0 {
			chunk := buf[:m]
			if isZero(chunk) {
				if _, serr := f.Seek(int64(m), io.SeekCurrent); serr != nil {
					return n, serr
				}
				hole = true
			} else {
				if _, werr := f.Write(chunk); werr != nil {
					return n, werr
				}
				hole = false
			}
			n += int64(m)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return n, err
		}
	}
	if hole {
		if err := f.Truncate(n); err != nil {
			return n, err
		}
	}
	return n, nil
}

var zeros = make([]byte, 64<<10)

func isZero(b []byte) bool { return bytes.Equal(b, zeros[:len(b)]) }
