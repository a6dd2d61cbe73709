// Package pagediff stores fixed-size images (a box's guest RAM image, its
// writable layer) as chains of page deltas: a checkpoint keeps only the
// 4 KiB pages that differ from its parent checkpoint's, found host-side by
// comparing per-page hashes (the parent's are stored with it), so that a
// checkpoint of a box that changed little costs little disk. The host
// kernel here has no soft-dirty page tracking, so every allocated page of
// the image is read and hashed at each checkpoint (holes are never read;
// zero pages are neither hashed nor stored), which is cheap next to
// writing and fsyncing it.
//
// Files, in one snapshot directory (a checkpoint's), for an image NAME:
//
//	NAME        a sparse file of the image's size holding, at their own
//	            offsets, the pages this link stores (all non-zero pages
//	            for a full image; those that differ from the parent's for
//	            a delta)
//	NAME.sums   the image's per-page hashes (Sums): a header, then one
//	            little-endian uint64 per page, 0 for a zero page; sparse
//	            where a run of pages is zero
//	chain.json  (Link) the parent directory, a sibling, and which images
//	            are deltas against it; absent: every image is whole
//
// A page's bytes are in the newest link of the chain whose hash for it
// differs from its parent's (or in the root): Materialise walks down the
// chain per page. Merge folds a link into its children before it is
// removed, so that removing a checkpoint in the middle keeps its children
// restorable.
//
// The hash is xxHash64 with a seed drawn at random for each chain's root
// (so a guest cannot aim a collision at it without knowing the seed); a
// collision only makes a checkpoint keep its parent's page, in the box's
// own state.
package pagediff

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/airlock-run/airlock/internal/boundedio"
	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// PageSize is the unit of comparison and storage, in bytes.
const PageSize = 4096

// MaxImage bounds the size of an image this package handles (1 TiB, the
// largest writable layer a box may have): its sums take 2 MiB per GiB.
const MaxImage = 1 << 40

// MaxChain bounds how many links a chain may have (a box keeps at most 64
// checkpoints; one more for safety).
const MaxChain = 65

const (
	sumsSuffix = ".sums"
	linkFile   = "chain.json"
	headerSize = PageSize
	magic      = "AIRLOCK-PAGESUMS"
	version    = 1
)

// SumsName returns the name of image name's sums file.
func SumsName(name string) string { return name + sumsSuffix }

// LinkName is the name of the file that links a snapshot directory to its
// parent (Link).
const LinkName = linkFile

// Sums are the per-page hashes of an image of Size bytes: H[i] is page i's
// hash under Seed, 0 for a page of zeros.
type Sums struct {
	Seed uint64
	Size int64
	H    []uint64
}

// pages returns how many pages an image of size bytes has.
func pages(size int64) int { return int((size + PageSize - 1) / PageSize) }

// NewSeed returns a seed for a new chain.
func NewSeed() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// hashPage returns page p's hash under seed: 0 for zeros, never 0 else.
func hashPage(d *xxhash.Digest, seed uint64, p []byte) uint64 {
	if isZero(p) {
		return 0
	}
	d.ResetWithSeed(seed)
	d.Write(p)
	if h := d.Sum64(); h != 0 {
		return h
	}
	return 1
}

var zeroPage = make([]byte, PageSize)

func isZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), PageSize)
		if !bytes.Equal(p[:n], zeroPage[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

// WriteSums writes s to path (a new file), leaving holes where a whole
// block of hashes is zero.
func WriteSums(path string, s *Sums) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	hdr := make([]byte, headerSize)
	copy(hdr, magic)
	binary.LittleEndian.PutUint32(hdr[16:], version)
	binary.LittleEndian.PutUint32(hdr[20:], PageSize)
	binary.LittleEndian.PutUint64(hdr[24:], uint64(s.Size))
	binary.LittleEndian.PutUint64(hdr[32:], s.Seed)
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return err
	}
	if err := f.Truncate(headerSize + int64(len(s.H))*8); err != nil {
		return err
	}
	const per = PageSize / 8 // hashes per block
	blk := make([]byte, PageSize)
	for i := 0; i < len(s.H); i += per {
		j := min(i+per, len(s.H))
		any := false
		for _, h := range s.H[i:j] {
			if h != 0 {
				any = true
				break
			}
		}
		if !any {
			continue
		}
		for k, h := range s.H[i:j] {
			binary.LittleEndian.PutUint64(blk[k*8:], h)
		}
		if _, err := f.WriteAt(blk[:(j-i)*8], headerSize+int64(i)*8); err != nil {
			return err
		}
	}
	return nil
}

// ReadSums reads the sums at path, which must be of an image of size
// bytes (the caller knows it: the machine's RAM, the layer's size).
func ReadSums(path string, size int64) (*Sums, error) {
	if size <= 0 || size > MaxImage {
		return nil, fmt.Errorf("page sums of a %d-byte image: out of range", size)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n := pages(size)
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if want := headerSize + int64(n)*8; st.Size() != want {
		return nil, fmt.Errorf("%s is %d bytes, want %d for a %d-byte image: damaged", filepath.Base(path), st.Size(), want, size)
	}
	hdr := make([]byte, headerSize)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, err
	}
	if string(hdr[:16]) != magic || binary.LittleEndian.Uint32(hdr[16:]) != version ||
		binary.LittleEndian.Uint32(hdr[20:]) != PageSize || int64(binary.LittleEndian.Uint64(hdr[24:])) != size {
		return nil, fmt.Errorf("%s: not page sums of a %d-byte image this airlock writes", filepath.Base(path), size)
	}
	s := &Sums{Seed: binary.LittleEndian.Uint64(hdr[32:]), Size: size, H: make([]uint64, n)}
	raw := make([]byte, 1<<20)
	for i := 0; i < n; {
		m := min(len(raw)/8, n-i)
		if _, err := io.ReadFull(f, raw[:m*8]); err != nil {
			return nil, err
		}
		for k := range m {
			s.H[i+k] = binary.LittleEndian.Uint64(raw[k*8:])
		}
		i += m
	}
	return s, nil
}

// Segment is a piece of an image read from a file: the image's bytes
// [Off, Off+Size) are Src's [SrcOff, SrcOff+Size).
type Segment struct {
	Src         *os.File
	SrcOff, Off int64
	Size        int64
}

// chunk is a piece of work for a hashing worker.
type chunk struct {
	seg      *Segment
	from, to int64 // in Src
}

// Save hashes the allocated pages of the image of size bytes made of segs
// and writes into the new sparse file dst (of size bytes) the non-zero
// pages whose hash differs from parent's (all non-zero pages when parent
// is nil). Hashing runs on workers goroutines (≥ 1). It returns the
// image's sums (parent's seed, or seed for a root) and the bytes stored.
// Holes of a segment are never read (a read of a memfd's hole would
// allocate a page).
func Save(dst string, size int64, segs []Segment, parent *Sums, seed uint64, workers int) (*Sums, int64, error) {
	if size <= 0 || size > MaxImage {
		return nil, 0, fmt.Errorf("an image of %d bytes: out of range", size)
	}
	if parent != nil {
		if parent.Size != size {
			parent = nil // another size: a whole image
		} else {
			seed = parent.Seed
		}
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, 0, err
	}
	defer out.Close()
	if err := out.Truncate(size); err != nil {
		return nil, 0, err
	}
	s := &Sums{Seed: seed, Size: size, H: make([]uint64, pages(size))}
	// The data ranges, cut into chunks for the workers.
	const chunkSize = 4 << 20
	var work []chunk
	for i := range segs {
		sg := &segs[i]
		if sg.Off < 0 || sg.Size < 0 || sg.Off+sg.Size > size || sg.Off%PageSize != 0 || sg.SrcOff%PageSize != 0 {
			return nil, 0, fmt.Errorf("segment [%d,+%d) of a %d-byte image: out of range or not page-aligned", sg.Off, sg.Size, size)
		}
		rs, err := dataRanges(sg.Src, sg.SrcOff, sg.SrcOff+sg.Size)
		if err != nil {
			return nil, 0, err
		}
		for _, r := range rs {
			for a := r[0]; a < r[1]; a += chunkSize {
				work = append(work, chunk{seg: sg, from: a, to: min(a+chunkSize, r[1])})
			}
		}
	}
	workers = max(1, min(workers, len(work)))
	var stored atomic.Int64
	var next atomic.Int64
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := make([]byte, chunkSize)
			d := xxhash.NewWithSeed(seed)
			for {
				i := int(next.Add(1) - 1)
				if i >= len(work) {
					return
				}
				c := work[i]
				n, err := hashChunk(out, c, buf, d, s, parent)
				stored.Add(n)
				if err != nil {
					errs[w] = err
					next.Store(int64(len(work))) // stop the others
					return
				}
			}
		}(w)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	return s, stored.Load(), out.Close()
}

// hashChunk hashes chunk c (read with buf) into s and writes the pages
// that differ from parent into out; it returns the bytes written.
func hashChunk(out *os.File, c chunk, buf []byte, d *xxhash.Digest, s *Sums, parent *Sums) (int64, error) {
	// Page-aligned in the image (segments are).
	from := c.from - (c.from-c.seg.SrcOff)%PageSize
	b := buf[:c.to-from]
	if n, err := c.seg.Src.ReadAt(b, from); n < len(b) {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	base := c.seg.Off + (from - c.seg.SrcOff) // image offset of b[0]
	var written int64
	runStart := -1
	flush := func(end int) error {
		if runStart < 0 {
			return nil
		}
		n, err := out.WriteAt(b[runStart:end], base+int64(runStart))
		written += int64(n)
		runStart = -1
		return err
	}
	for p := 0; p < len(b); p += PageSize {
		q := min(p+PageSize, len(b))
		idx := int((base + int64(p)) / PageSize)
		h := hashPage(d, s.Seed, b[p:q])
		s.H[idx] = h
		changed := h != 0 && (parent == nil || parent.H[idx] != h)
		if changed && runStart < 0 {
			runStart = p
		} else if !changed {
			if err := flush(p); err != nil {
				return written, err
			}
		}
	}
	return written, flush(len(b))
}

// dataRanges returns the allocated ranges of f within [from, to)
// (SEEK_DATA/SEEK_HOLE), page-aligned outwards within it.
func dataRanges(f *os.File, from, to int64) ([][2]int64, error) {
	var out [][2]int64
	fd := int(f.Fd())
	for off := from; off < to; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && data >= to) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seek hole: %w", err)
		}
		a := max(from, data-(data-from)%PageSize)
		e := min(to, hole)
		if r := (e - from) % PageSize; r != 0 {
			e = min(to, e+PageSize-r)
		}
		if n := len(out); n > 0 && out[n-1][1] >= a {
			out[n-1][1] = max(out[n-1][1], e)
		} else {
			out = append(out, [2]int64{a, e})
		}
		off = e
	}
	return out, nil
}

// Link is what chain.json says: Parent is the parent snapshot directory's
// name (a sibling), Deltas the images stored as deltas against it.
type Link struct {
	Version int      `json:"v"`
	Parent  string   `json:"parent,omitempty"`
	Deltas  []string `json:"deltas,omitempty"`
}

// maxLink bounds chain.json.
const maxLink = 4 << 10

// ReadLink reads dir's chain.json; a directory without one is a whole
// snapshot (the zero Link).
func ReadLink(dir string) (Link, error) {
	var l Link
	raw, err := boundedio.ReadFile(filepath.Join(dir, linkFile), maxLink)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return l, err
	}
	if err := json.Unmarshal(raw, &l); err != nil {
		return l, fmt.Errorf("%s: %w", linkFile, err)
	}
	if l.Version != version {
		return l, fmt.Errorf("%s: format %d, not one this airlock reads", linkFile, l.Version)
	}
	if l.Parent != "" && (l.Parent != filepath.Base(l.Parent) || l.Parent == "." || l.Parent == "..") {
		return l, fmt.Errorf("%s: parent %q is not a sibling's name", linkFile, l.Parent)
	}
	if l.Parent == "" && len(l.Deltas) > 0 {
		return l, fmt.Errorf("%s: deltas without a parent", linkFile)
	}
	return l, nil
}

// WriteLink replaces dir's chain.json with l (a rename).
func WriteLink(dir string, l Link) error {
	l.Version = version
	raw, _ := json.Marshal(l)
	tmp := filepath.Join(dir, linkFile+".tmp")
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, linkFile))
}

func (l Link) delta(name string) bool {
	for _, d := range l.Deltas {
		if d == name {
			return true
		}
	}
	return false
}

// Chain returns the directories that hold image name of the snapshot in
// dir: dir first, then its parents as long as the image is a delta.
// Errors: a parent gone, a cycle, more than MaxChain links.
func Chain(dir, name string) ([]string, error) {
	out := []string{dir}
	seen := map[string]bool{filepath.Base(dir): true}
	for d := dir; ; {
		l, err := ReadLink(d)
		if err != nil {
			return nil, err
		}
		if !l.delta(name) {
			return out, nil
		}
		if seen[l.Parent] || len(out) >= MaxChain {
			return nil, fmt.Errorf("the chain of %s through %s loops or is longer than %d", filepath.Base(dir), l.Parent, MaxChain)
		}
		seen[l.Parent] = true
		d = filepath.Join(filepath.Dir(d), l.Parent)
		if _, err := os.Stat(d); err != nil {
			return nil, fmt.Errorf("%s's parent %s is gone: %w", filepath.Base(dir), l.Parent, err)
		}
		out = append(out, d)
	}
}

// IsDelta says whether image name in dir is stored as a delta (its
// restore must Materialise it).
func IsDelta(dir, name string) bool {
	l, err := ReadLink(dir)
	return err == nil && l.delta(name)
}

// source is one link of a chain, opened.
type source struct {
	f    *os.File
	sums *Sums
}

func openChain(dirs []string, name string, size int64) ([]source, error) {
	var out []source
	for _, d := range dirs {
		s, err := ReadSums(filepath.Join(d, SumsName(name)), size)
		if err != nil {
			closeSources(out)
			return nil, err
		}
		f, err := os.Open(filepath.Join(d, name))
		if err != nil {
			closeSources(out)
			return nil, err
		}
		out = append(out, source{f: f, sums: s})
	}
	if len(out) > 1 {
		for _, s := range out[1:] {
			if s.sums.Seed != out[0].sums.Seed {
				closeSources(out)
				return nil, errors.New("a checkpoint chain whose links were hashed with different seeds: damaged")
			}
		}
	}
	return out, nil
}

func closeSources(s []source) {
	for _, x := range s {
		x.f.Close()
	}
}

// owner returns the index of the link of srcs that holds page i.
func owner(srcs []source, i int) int {
	k := 0
	for k+1 < len(srcs) && srcs[k].sums.H[i] == srcs[k+1].sums.H[i] {
		k++
	}
	return k
}

// Materialise writes the image name (of size bytes) of the snapshot in
// dirs[0], whose chain is dirs (Chain), range [from, from+n), into dst at
// 0: each non-zero page from the link that holds it. dst must read as
// zeros there (a new file or memfd); it is not truncated. It returns the
// bytes written.
func Materialise(dst *os.File, dirs []string, name string, size, from, n int64) (int64, error) {
	if from < 0 || n < 0 || from+n > size || from%PageSize != 0 {
		return 0, fmt.Errorf("range [%d,+%d) of a %d-byte image", from, n, size)
	}
	srcs, err := openChain(dirs, name, size)
	if err != nil {
		return 0, err
	}
	defer closeSources(srcs)
	var written int64
	first, last := int(from/PageSize), pages(from+n)
	buf := make([]byte, 1<<20)
	kernel := true
	for i := first; i < last; {
		if srcs[0].sums.H[i] == 0 {
			i++
			continue
		}
		k := owner(srcs, i)
		j := i + 1
		for j < last && j-i < len(buf)/PageSize && srcs[0].sums.H[j] != 0 && owner(srcs, j) == k {
			j++
		}
		off := int64(i) * PageSize
		end := min(int64(j)*PageSize, from+n)
		m, err := copyRange(dst, srcs[k].f, off, off-from, end-off, buf, &kernel)
		written += m
		if err != nil {
			return written, err
		}
		i = j
	}
	return written, nil
}

// copyRange copies n bytes of src at off to dst at dstOff: in the kernel
// where it can (copy_file_range on one filesystem, else sendfile, which
// moves dst's file offset), else through buf.
func copyRange(dst, src *os.File, off, dstOff, n int64, buf []byte, kernel *bool) (int64, error) {
	var done int64
	for *kernel && done < n {
		so, do := off+done, dstOff+done
		m, err := unix.CopyFileRange(int(src.Fd()), &so, int(dst.Fd()), &do, int(n-done), 0)
		if err != nil || m == 0 {
			*kernel = false // another filesystem (a memfd): through buf
			break
		}
		done += int64(m)
	}
	if done < n {
		// sendfile: in the kernel too, into any file (a memfd).
		if _, err := unix.Seek(int(dst.Fd()), dstOff+done, io.SeekStart); err == nil {
			for done < n {
				so := off + done
				m, err := unix.Sendfile(int(dst.Fd()), int(src.Fd()), &so, int(min(n-done, 1<<30)))
				if err != nil || m == 0 {
					break
				}
				done += int64(m)
			}
		}
	}
	for done < n {
		b := buf[:min(int64(len(buf)), n-done)]
		if m, err := src.ReadAt(b, off+done); m < len(b) {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return done, err
		}
		if _, err := dst.WriteAt(b, dstOff+done); err != nil {
			return done, err
		}
		done += int64(len(b))
	}
	return done, nil
}

// Merge folds the snapshot in dir into those of children (directories
// whose chain.json names dir as parent) before dir is removed: for each
// image a child stores as a delta against dir, the pages it takes from
// dir (same hash, and dir holds them) are copied into the child's image,
// and the child's parent becomes dir's parent (or none, its images whole
// where dir's were). size returns the size of image name (the caller
// knows it). A child cut short in the middle stays restorable: pages are
// copied before its link changes.
func Merge(dir string, children []string, size func(child, name string) (int64, error)) error {
	up, err := ReadLink(dir)
	if err != nil {
		return err
	}
	for _, c := range children {
		l, err := ReadLink(c)
		if err != nil {
			return err
		}
		if l.Parent != filepath.Base(dir) || len(l.Deltas) == 0 {
			continue
		}
		var keep []string
		for _, name := range l.Deltas {
			sz, err := size(c, name)
			if err != nil {
				return err
			}
			if err := mergeImage(dir, c, name, sz, up.delta(name)); err != nil {
				return fmt.Errorf("fold %s into %s: %w", filepath.Base(dir), filepath.Base(c), err)
			}
			if up.delta(name) {
				keep = append(keep, name)
			}
		}
		nl := Link{Deltas: keep}
		if len(keep) > 0 {
			nl.Parent = up.Parent
		}
		if err := WriteLink(c, nl); err != nil {
			return err
		}
	}
	return nil
}

// mergeImage copies into child's image name the pages it takes from
// dir's: all of dir's it shares when dir's image is whole (upDelta
// false), else those dir itself holds (its hash differs from its
// parent's).
func mergeImage(dir, child, name string, size int64, upDelta bool) error {
	dirs := []string{child, dir}
	if upDelta {
		l, err := ReadLink(dir)
		if err != nil {
			return err
		}
		dirs = append(dirs, filepath.Join(filepath.Dir(dir), l.Parent))
	}
	srcs, err := openChain(dirs, name, size)
	if err != nil {
		return err
	}
	defer closeSources(srcs)
	out, err := os.OpenFile(filepath.Join(child, name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer out.Close()
	buf := make([]byte, 1<<20)
	kernel := true
	n := pages(size)
	for i := 0; i < n; {
		if srcs[0].sums.H[i] == 0 || owner(srcs, i) != 1 {
			i++
			continue
		}
		j := i + 1
		for j < n && j-i < len(buf)/PageSize && srcs[0].sums.H[j] != 0 && owner(srcs, j) == 1 {
			j++
		}
		off := int64(i) * PageSize
		if _, err := copyRange(out, srcs[1].f, off, off, min(int64(j)*PageSize, size)-off, buf, &kernel); err != nil {
			return err
		}
		i = j
	}
	return out.Sync()
}

// Flatten writes the snapshot in dir as a whole one into the empty
// directory dst: each delta image materialised from its chain, the other
// files hard-linked (they are never written in place), the sums and the
// link left out, and those keep says no to. The result needs no other
// directory.
func Flatten(dir, dst string, keep func(name string) bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	l, err := ReadLink(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		if name == linkFile || filepath.Ext(name) == sumsSuffix || !keep(name) {
			continue
		}
		src, out := filepath.Join(dir, name), filepath.Join(dst, name)
		if !l.delta(name) || !e.Type().IsRegular() {
			if err := linkTree(src, out); err != nil {
				return err
			}
			continue
		}
		chain, err := Chain(dir, name)
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		err = f.Truncate(fi.Size())
		if err == nil {
			_, err = Materialise(f, chain, name, fi.Size(), 0, fi.Size())
		}
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// linkTree makes dst a copy of the tree at src whose regular files are
// hard links (directories made, symbolic links copied, the rest left out).
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.Mkdir(out, 0o700)
		case d.Type().IsRegular():
			return os.Link(p, out)
		case d.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, out)
		}
		return nil
	})
}
