// Package boxarchive reads and writes box archives (airlock's Box.Export
// and Runtime.ImportBox): a plain tar of fixed entries,
//
//	airlock-box.json   the Manifest: what the box is, and the entries below
//	rw.ext4.data       the writable layer's data ranges, back to back
//	                   (Manifest.Disk lists where each goes; holes are
//	                   left out, so a 4 GiB disk with 20 MiB of data takes
//	                   20 MiB)
//
// and, for an archive with memory (Kind "snapshot"):
//
//	snapshot.json      the snapshot's metadata (airlock's snapshot record)
//	machine.json       the driver's machine description
//	state              the memory and device state
//	ram.data           only where the snapshot has a RAM image (guest RAM
//	                   kept out of the state): its data ranges, back to
//	                   back, placed by Manifest.RAM as rw.ext4.data by Disk
//
// An archive is hostile input. Read accepts exactly these names, in this
// order, as regular (not sparse) files of the sizes the manifest declares
// within the Limits its caller gives, and checks each one's SHA-256. No
// entry name becomes a path: the files land in a directory under fixed
// names (those of a snapshot directory: DiskFile, SnapshotFile,
// MachineFile, StateFile, RAMFile).
//
// The package knows the format only: the box configuration the manifest
// carries (Manifest.Config) is raw JSON that the caller decodes and
// checks, and the limits it returns depend on it.
package boxarchive

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/unpack"
)

// Entry names in an archive, and the version it is written with.
const (
	MetaName = "airlock-box.json"
	DiskName = "rw.ext4.data"
	RAMName  = "ram.data"
	Version  = 1
	// MaxJSON bounds each JSON entry of an archive (the manifest,
	// snapshot.json, machine.json), in bytes.
	MaxJSON = 1 << 20
)

// File names in a snapshot directory (the driver's names:
// internal/vmm/qemu snapshot.go) that Write reads and Read writes. The
// disk and RAM image are sparse files there; SnapshotFile, MachineFile and
// StateFile are also the names of their archive entries.
const (
	DiskFile     = "rw.ext4"
	SnapshotFile = "snapshot.json"
	MachineFile  = "machine.json"
	StateFile    = "state"
	RAMFile      = "ram"
)

// Kinds of archive (Manifest.Kind).
const (
	KindBox      = "box"      // configuration and writable layer
	KindSnapshot = "snapshot" // also memory and device state
)

// ErrLimit is wrapped by the error of an archive whose sizes exceed the
// Limits it is read with (it is airlock.ErrLimit).
var ErrLimit = unpack.ErrLimit

// Manifest is airlock-box.json.
type Manifest struct {
	Version int `json:"v"`
	// Kind is KindBox or KindSnapshot.
	Kind        string          `json:"kind"`
	Box         string          `json:"box"`
	BoxName     string          `json:"box_name,omitempty"`
	Snapshot    string          `json:"snapshot,omitempty"`
	Image       string          `json:"image"`
	ImageDigest string          `json:"image_digest"`
	Config      json.RawMessage `json:"config"` // the box's configuration, the caller's format
	Exported    time.Time       `json:"exported"`
	Disk        DiskMap         `json:"disk"`
	// RAM places ram.data (a snapshot with a RAM image); nil: none.
	RAM *DiskMap `json:"ram,omitempty"`
	// Files are the entries after this one, in order.
	Files []File `json:"files"`
}

// DataBytes is the bytes of all entries after the manifest.
func (m *Manifest) DataBytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// DiskMap places rw.ext4.data (or ram.data): Extents are [offset, length]
// pairs in ascending order within Size (bytes).
type DiskMap struct {
	Size    int64      `json:"size"`
	Extents [][2]int64 `json:"extents"`
}

// File is an entry the manifest lists: its name, size in bytes and
// SHA-256 (hex).
type File struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Stats describes an archive Write wrote, in bytes: the whole archive,
// the writable layer's data in it, and the memory and device state (0
// without memory).
type Stats struct {
	Bytes, DiskBytes, StateBytes int64
}

// Write writes m's archive to w: the data of the sparse disk file disk,
// then, with snapDir != "" (m.Kind KindSnapshot), the files of that
// snapshot directory (SnapshotFile, MachineFile, StateFile and, where
// there is one, RAMFile). It fills in m's Version, Disk, RAM and Files.
// The files must not change while it runs (their checksums are taken
// before they are written); an error says which did.
func Write(ctx context.Context, w io.Writer, m Manifest, disk, snapDir string) (Stats, error) {
	var st Stats
	m.Version = Version
	f, err := os.Open(disk)
	if err != nil {
		return st, err
	}
	defer f.Close()
	dm, err := dataExtents(f)
	if err != nil {
		return st, fmt.Errorf("map the writable layer: %w", err)
	}
	m.Disk = dm
	dataLen := extentsLen(dm)
	// Checksums first: the manifest lists them.
	sum := sha256.New()
	if err := copyExtents(ctx, sum, f, dm); err != nil {
		return st, err
	}
	m.Files = []File{{Name: DiskName, Size: dataLen, SHA256: hex.EncodeToString(sum.Sum(nil))}}
	m.RAM = nil
	var ram *os.File
	if snapDir != "" {
		for _, name := range []string{SnapshotFile, MachineFile, StateFile} {
			af, err := hashFile(ctx, filepath.Join(snapDir, name))
			if err != nil {
				return st, err
			}
			af.Name = name
			m.Files = append(m.Files, af)
		}
		if ram, err = os.Open(filepath.Join(snapDir, RAMFile)); err == nil {
			defer ram.Close()
			rm, err := dataExtents(ram)
			if err != nil {
				return st, fmt.Errorf("map the RAM image: %w", err)
			}
			m.RAM = &rm
			sum := sha256.New()
			if err := copyExtents(ctx, sum, ram, rm); err != nil {
				return st, err
			}
			m.Files = append(m.Files, File{Name: RAMName, Size: extentsLen(rm), SHA256: hex.EncodeToString(sum.Sum(nil))})
		} else if !os.IsNotExist(err) {
			return st, err
		}
	}
	raw, _ := json.MarshalIndent(m, "", "  ")
	cw := &countWriter{w: w}
	tw := tar.NewWriter(cw)
	hdr := func(name string, size int64) error {
		return tw.WriteHeader(&tar.Header{Name: name, Size: size, Mode: 0o600, Typeflag: tar.TypeReg, ModTime: m.Exported, Format: tar.FormatPAX})
	}
	if err := hdr(MetaName, int64(len(raw))); err != nil {
		return st, err
	}
	if _, err := tw.Write(raw); err != nil {
		return st, err
	}
	if err := hdr(DiskName, dataLen); err != nil {
		return st, err
	}
	if err := copyExtents(ctx, tw, f, dm); err != nil {
		return st, err
	}
	st.DiskBytes = dataLen
	for _, af := range m.Files[1:] {
		if err := hdr(af.Name, af.Size); err != nil {
			return st, err
		}
		if af.Name == RAMName {
			if err := copyExtents(ctx, tw, ram, *m.RAM); err != nil {
				return st, err
			}
			st.StateBytes += af.Size
			continue
		}
		g, err := os.Open(filepath.Join(snapDir, af.Name))
		if err != nil {
			return st, err
		}
		_, err = io.CopyN(tw, g, af.Size)
		g.Close()
		if err != nil {
			return st, fmt.Errorf("%s changed while it was exported: %w", af.Name, err)
		}
		if af.Name == StateFile {
			st.StateBytes += af.Size
		}
	}
	if err := tw.Close(); err != nil {
		return st, err
	}
	st.Bytes = cw.n
	return st, nil
}

// Limits are the sizes an archive's box allows, from its configuration
// (Manifest.Config, as the caller reads and bounds it).
type Limits struct {
	// DiskBytes is the box's disk size: Manifest.Disk.Size must be it.
	DiskBytes int64
	// MemoryBytes is the box's memory size: a RAM image's size must be
	// it, and the state is at most it plus 256 MiB of device state.
	MemoryBytes int64
	// CheckFile, if not nil, is called with the content of each JSON
	// entry of a snapshot archive (SnapshotFile, MachineFile) once its
	// checksum is checked, before the next entry is read; its error
	// refuses the archive. (airlock checks the kernel command line
	// machine.json holds, and the names snapshot.json carries.)
	CheckFile func(name string, content []byte) error
}

// Reader reads one archive: Read has read and checked its manifest,
// Extract reads its entries.
type Reader struct {
	tr  *tar.Reader
	m   Manifest
	lim Limits
}

// Read reads an archive's manifest from r and checks it: the format
// version, the kind, the box id (letters, digits, '.', '_', '-', at most
// 56), the image reference and digest, then, against the Limits that
// limits returns for it (limits decodes and bounds m.Config; its error is
// returned as is), the entries it lists (names, order, sizes, checksum
// syntax) and the disk and RAM maps. Nothing is written. Errors wrap
// ErrLimit for sizes past the limits.
func Read(r io.Reader, limits func(m *Manifest) (Limits, error)) (*Reader, error) {
	rd := &Reader{tr: tar.NewReader(r)}
	if err := rd.next(MetaName, -1); err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(io.LimitReader(rd.tr, MaxJSON+1))
	if err != nil {
		return nil, fmt.Errorf("read archive: %w", err)
	}
	if len(raw) > MaxJSON {
		return nil, fmt.Errorf("%s is larger than %d bytes: %w", MetaName, MaxJSON, ErrLimit)
	}
	m := &rd.m
	if err := json.Unmarshal(raw, m); err != nil {
		return nil, fmt.Errorf("%s: %w", MetaName, err)
	}
	if m.Version != Version {
		return nil, fmt.Errorf("archive format version %d is not one this airlock reads (%d)", m.Version, Version)
	}
	if m.Kind != KindBox && m.Kind != KindSnapshot {
		return nil, fmt.Errorf("archive kind %q is not one this airlock reads (box, snapshot)", m.Kind)
	}
	// The box's id and name are listed with an imported snapshot
	// (airlock snapshot ls prints the id): no terminal escapes.
	if !boxID.MatchString(m.Box) {
		return nil, fmt.Errorf("the archive's box id %q is not a box id (letters, digits, '.', '_', '-', at most 56): not an archive Box.Export wrote", m.Box)
	}
	if _, err := image.Normalize(m.Image); err != nil || !imageDigest.MatchString(m.ImageDigest) {
		return nil, fmt.Errorf("the archive names image %q (%q): not an image reference and digest", m.Image, m.ImageDigest)
	}
	if rd.lim, err = limits(m); err != nil {
		return nil, err
	}
	if err := check(m, rd.lim); err != nil {
		return nil, err
	}
	return rd, nil
}

// Manifest is the archive's manifest, as Read checked it.
func (rd *Reader) Manifest() *Manifest { return &rd.m }

// Extract reads the archive's entries into dir (which exists): the disk
// as the sparse file DiskFile, a snapshot's files under their names, its
// RAM image as the sparse file RAMFile. Each entry must be a regular file
// of the size the manifest lists, with its SHA-256. On an error, the
// files already written stay: the caller removes dir.
func (rd *Reader) Extract(ctx context.Context, dir string) error {
	m := &rd.m
	if err := rd.next(DiskName, m.Files[0].Size); err != nil {
		return err
	}
	if err := writeSparse(ctx, rd.tr, filepath.Join(dir, DiskFile), m.Disk, m.Files[0]); err != nil {
		return err
	}
	for _, af := range m.Files[1:] {
		if err := rd.next(af.Name, af.Size); err != nil {
			return err
		}
		if af.Name == RAMName {
			if err := writeSparse(ctx, rd.tr, filepath.Join(dir, RAMFile), *m.RAM, af); err != nil {
				return err
			}
			continue
		}
		p := filepath.Join(dir, af.Name)
		if err := writeChecked(ctx, rd.tr, p, af); err != nil {
			return err
		}
		if rd.lim.CheckFile != nil && (af.Name == SnapshotFile || af.Name == MachineFile) {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := rd.lim.CheckFile(af.Name, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// next reads the next entry's header: want, a regular file, not sparse,
// of size bytes (size < 0: any).
func (rd *Reader) next(want string, size int64) error {
	h, err := rd.tr.Next()
	if err == io.EOF {
		return fmt.Errorf("archive ends before %s: not a complete airlock box archive", want)
	}
	if err != nil {
		return fmt.Errorf("read archive: %w", err)
	}
	if h.Name != want {
		return fmt.Errorf("archive entry %q where %s was expected: not an airlock box archive (or a newer one)", h.Name, want)
	}
	if h.Typeflag != tar.TypeReg {
		return fmt.Errorf("archive entry %s is not a regular file", want)
	}
	// archive/tar expands a GNU sparse entry (PAX GNU.sparse.* records)
	// to its declared size, holes as zeros, without bound: a few KiB of
	// archive would write gigabytes. Write never writes one.
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return fmt.Errorf("archive entry %s is a sparse file (PAX %s): airlock box archives hold plain files only; not an archive Box.Export wrote", want, k)
		}
	}
	if size >= 0 && h.Size != size {
		return fmt.Errorf("archive entry %s is %d bytes, not the %d its header declares", want, h.Size, size)
	}
	return nil
}

var imageDigest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// boxID is what Read accepts as the exported box's id: one that
// "import-"+id makes a snapshot name of.
var boxID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,55}$`)

// check checks m's declared layout against lim.
func check(m *Manifest, lim Limits) error {
	want := []string{DiskName}
	if m.Kind == KindSnapshot {
		want = append(want, SnapshotFile, MachineFile, StateFile)
		if m.RAM != nil {
			want = append(want, RAMName)
		}
	} else if m.RAM != nil {
		return fmt.Errorf("the archive places a RAM image but is not of a snapshot")
	}
	if len(m.Files) != len(want) {
		return fmt.Errorf("the archive lists %d entries, not the %d of a %s archive", len(m.Files), len(want), m.Kind)
	}
	d := m.Disk
	if d.Size != lim.DiskBytes {
		return fmt.Errorf("the archive's disk is %d bytes, not the %d MiB of its box's options", d.Size, lim.DiskBytes>>20)
	}
	data, err := checkExtents(d, "disk")
	if err != nil {
		return err
	}
	limits := map[string]int64{DiskName: data, SnapshotFile: MaxJSON, MachineFile: MaxJSON,
		// The migration stream holds at most the guest's RAM, plus
		// device state.
		StateFile: lim.MemoryBytes + 256<<20}
	if m.RAM != nil {
		if m.RAM.Size != lim.MemoryBytes {
			return fmt.Errorf("the archive's RAM image is %d bytes, not the %d MiB of its box's options", m.RAM.Size, lim.MemoryBytes>>20)
		}
		if limits[RAMName], err = checkExtents(*m.RAM, "RAM image"); err != nil {
			return err
		}
	}
	for i, af := range m.Files {
		if af.Name != want[i] {
			return fmt.Errorf("the archive lists entry %q where %s belongs", af.Name, want[i])
		}
		if af.Size < 0 || af.Size > limits[af.Name] || (af.Name == DiskName || af.Name == RAMName) && af.Size != limits[af.Name] {
			return fmt.Errorf("the archive's %s is %d bytes, over what its box allows (%d): %w", af.Name, af.Size, limits[af.Name], ErrLimit)
		}
		if b, err := hex.DecodeString(af.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("the archive's %s has no valid SHA-256", af.Name)
		}
	}
	return nil
}

// checkExtents checks that dm's ranges are in order within its size and
// returns the bytes of data they place.
func checkExtents(dm DiskMap, what string) (int64, error) {
	var data, end int64
	for _, e := range dm.Extents {
		if e[0] < end || e[1] <= 0 || e[0]+e[1] > dm.Size || e[0]+e[1] < e[0] {
			return 0, fmt.Errorf("the archive's %s map has a range [%d, +%d) out of order or outside its %d bytes", what, e[0], e[1], dm.Size)
		}
		end = e[0] + e[1]
		data += e[1]
	}
	return data, nil
}

// writeSparse makes dst a sparse file of dm.Size with the archive's data
// ranges at their offsets, checking af's SHA-256.
func writeSparse(ctx context.Context, r io.Reader, dst string, dm DiskMap, af File) (err error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if err := f.Truncate(dm.Size); err != nil {
		return err
	}
	h := sha256.New()
	in := io.TeeReader(ctxReader{ctx, r}, h)
	for _, e := range dm.Extents {
		n, err := io.Copy(io.NewOffsetWriter(f, e[0]), io.LimitReader(in, e[1]))
		if err != nil {
			return err
		}
		if n != e[1] {
			return fmt.Errorf("the archive's %s data ends early", af.Name)
		}
	}
	return checkSum(h, af.SHA256, af.Name)
}

func writeChecked(ctx context.Context, r io.Reader, dst string, af File) (err error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, r}, af.Size))
	if err != nil {
		return err
	}
	if n != af.Size {
		return fmt.Errorf("the archive's %s ends early", af.Name)
	}
	return checkSum(h, af.SHA256, af.Name)
}

func checkSum(h hash.Hash, want, what string) error {
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("the archive's %s does not match its SHA-256 (damaged in transit?)", what)
	}
	return nil
}

// IsArchive reports whether r starts like a box archive: a tar whose
// first entry is its manifest. It reads r's first header.
func IsArchive(r io.Reader) bool {
	h, err := tar.NewReader(r).Next()
	return err == nil && h.Name == MetaName
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func hashFile(ctx context.Context, p string) (File, error) {
	f, err := os.Open(p)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, ctxReader{ctx, f})
	if err != nil {
		return File{}, err
	}
	return File{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// extentsLen is the bytes of data dm places.
func extentsLen(dm DiskMap) int64 {
	var n int64
	for _, e := range dm.Extents {
		n += e[1]
	}
	return n
}

// dataExtents maps f's data (SEEK_DATA / SEEK_HOLE).
func dataExtents(f *os.File) (DiskMap, error) {
	fi, err := f.Stat()
	if err != nil {
		return DiskMap{}, err
	}
	dm := DiskMap{Size: fi.Size(), Extents: [][2]int64{}}
	fd := int(f.Fd())
	for off := int64(0); off < dm.Size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break
		}
		if err != nil {
			return dm, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return dm, err
		}
		dm.Extents = append(dm.Extents, [2]int64{data, hole - data})
		off = hole
	}
	return dm, nil
}

func copyExtents(ctx context.Context, w io.Writer, f *os.File, dm DiskMap) error {
	for _, e := range dm.Extents {
		if _, err := io.Copy(w, ctxReader{ctx, io.NewSectionReader(f, e[0], e[1])}); err != nil {
			return err
		}
	}
	return nil
}
