package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gofrs/flock"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// hasBlob reports whether a blob is present (with the expected size, when
// size >= 0).
func (s *Store) hasBlob(h v1.Hash, size int64) bool {
	fi, err := os.Stat(s.blobPath(h))
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	return size < 0 || fi.Size() == size
}

func checkAlgorithm(h v1.Hash) error {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return fmt.Errorf("unsupported digest %q (only sha256 is supported)", h.String())
	}
	if _, err := hex.DecodeString(h.Hex); err != nil {
		return fmt.Errorf("invalid digest %q", h.String())
	}
	return nil
}

// ensureBlob makes sure the blob h (of size bytes, -1 if unknown) is in the
// store. If it is missing, it takes the blob's download lock (so concurrent
// writers in this and other processes fetch it once), calls open, and writes
// the stream through writeBlob. progress, if not nil, gets the bytes written
// so far.
func (s *Store) ensureBlob(ctx context.Context, h v1.Hash, size int64, open func() (io.ReadCloser, error), progress func(done int64)) error {
	if err := checkAlgorithm(h); err != nil {
		return err
	}
	if s.hasBlob(h, size) {
		return nil
	}
	l := flock.New(filepath.Join(s.dir, "locks", h.Hex+".lock"))
	if _, err := l.TryLockContext(ctx, 50*time.Millisecond); err != nil {
		return fmt.Errorf("lock blob %s: %w", h, err)
	}
	defer l.Unlock()
	if s.hasBlob(h, size) {
		return nil
	}
	rc, err := open()
	if err != nil {
		return err
	}
	defer rc.Close()
	return s.writeBlob(ctx, h, size, rc, progress)
}

// writeBlob copies r into a temporary file, checks its sha256 digest and
// size (when size >= 0) and renames it to blobs/sha256/<hex>. Content that
// does not match is discarded and an error wrapping ErrDigestMismatch is
// returned.
func (s *Store) writeBlob(ctx context.Context, h v1.Hash, size int64, r io.Reader, progress func(done int64)) error {
	if err := checkAlgorithm(h); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), "blob-"+h.Hex[:12]+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	d := sha256.New()
	w := io.MultiWriter(f, d)
	var n int64
	buf := make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			f.Close()
			return err
		}
		m, rerr := r.Read(buf)
		if m > 0 {
			if _, err := w.Write(buf[:m]); err != nil {
				f.Close()
				return err
			}
			n += int64(m)
			if progress != nil {
				progress(n)
			}
			if size >= 0 && n > size {
				f.Close()
				return fmt.Errorf("blob %s: more than the expected %d bytes: %w", h, size, ErrDigestMismatch)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			f.Close()
			if errors.Is(rerr, ErrDigestMismatch) {
				return rerr
			}
			// go-containerregistry verifies remote blobs itself and reports a
			// mismatch as an untyped error at the end of the stream.
			got := "sha256:" + hex.EncodeToString(d.Sum(nil))
			if strings.Contains(rerr.Error(), "error verifying") || (size >= 0 && n >= size && got != h.String()) {
				return fmt.Errorf("blob %s: content does not match (%v), refusing it: %w", h, rerr, ErrDigestMismatch)
			}
			return fmt.Errorf("blob %s: read after %d bytes: %w", h, n, rerr)
		}
	}
	if size >= 0 && n != size {
		f.Close()
		return fmt.Errorf("blob %s: truncated: got %d bytes, want %d: %w", h, n, size, ErrDigestMismatch)
	}
	if got := "sha256:" + hex.EncodeToString(d.Sum(nil)); got != h.String() {
		f.Close()
		return fmt.Errorf("blob %s: got content with digest %s (%d bytes), refusing it: %w", h, got, n, ErrDigestMismatch)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.blobPath(h))
}

// putBytes stores a small blob held in memory and returns its descriptor
// digest.
func (s *Store) putBytes(ctx context.Context, b []byte) (v1.Hash, error) {
	sum := sha256.Sum256(b)
	h := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	if s.hasBlob(h, int64(len(b))) {
		return h, nil
	}
	return h, s.writeBlob(ctx, h, int64(len(b)), bytes.NewReader(b), nil)
}

// readBlob reads a whole (small) blob and verifies it.
func (s *Store) readBlob(h v1.Hash, size int64) ([]byte, error) {
	rc, err := s.openBlob(h, size)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// openBlob opens a stored blob. The reader verifies the content while it is
// read: the Read that reaches the end, and Close, return an error wrapping
// ErrDigestMismatch if the content does not match h (Close first reads any
// unread rest).
func (s *Store) openBlob(h v1.Hash, size int64) (io.ReadCloser, error) {
	if err := checkAlgorithm(h); err != nil {
		return nil, err
	}
	f, err := os.Open(s.blobPath(h))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("blob %s is missing from %s (pull or import the image again): %w", h, s.dir, ErrNotFound)
		}
		return nil, err
	}
	if size >= 0 {
		if fi, err := f.Stat(); err == nil && fi.Size() != size {
			f.Close()
			return nil, fmt.Errorf("blob %s in %s has %d bytes, want %d (pull or import the image again): %w", h, s.dir, fi.Size(), size, ErrDigestMismatch)
		}
	}
	return &verifyReader{f: f, h: h, d: sha256.New(), path: s.blobPath(h)}, nil
}

type verifyReader struct {
	f    *os.File
	h    v1.Hash
	d    hash.Hash
	path string
	err  error
	done bool
}

func (v *verifyReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.f.Read(p)
	v.d.Write(p[:n])
	if err == io.EOF {
		v.done = true
		if got := "sha256:" + hex.EncodeToString(v.d.Sum(nil)); got != v.h.String() {
			v.err = fmt.Errorf("stored blob %s is damaged (its content hashes to %s); remove the image and pull or import it again: %w", v.path, got, ErrDigestMismatch)
			return n, v.err
		}
	}
	return n, err
}

func (v *verifyReader) Close() error {
	if v.err == nil && !v.done {
		if _, err := io.Copy(io.Discard, v); err != nil && v.err == nil {
			v.err = err
		}
	}
	cerr := v.f.Close()
	if v.err != nil && v.err != io.EOF {
		return v.err
	}
	return cerr
}
