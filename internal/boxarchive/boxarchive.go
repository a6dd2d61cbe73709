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
// and, for a box archive written with its checkpoints
// (Manifest.Checkpoints, at most MaxCheckpoints, parents before
// children), for each checkpoint I (0, 1, ...) in order:
//
//	checkpoint.I.rw.ext4.data   its writable layer's data (Checkpoint.Disk)
//	checkpoint.I.machine.json   its machine description
//	checkpoint.I.state          its memory and device state
//	checkpoint.I.ram.data       its RAM image's data, where it has one
//	                            (Checkpoint.RAM)
//
// Each checkpoint is whole (what the box stores as page deltas against its
// parent is filled in on export): the archive carries no delta chains, so
// nothing in it is read as a link to another checkpoint; Parent only
// shapes the tree.
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

	"github.com/airlock-run/airlock/internal/checkpoint"
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
	// Checkpoints are the box's checkpoints (a KindBox archive written
	// with them), each after its parent; nil: none (archives written
	// before checkpoints were exported have none).
	Checkpoints []Checkpoint `json:"checkpoints,omitempty"`
	// CheckpointHead is the checkpoint the box was last checkpointed at
	// or rolled back to ("" none): the parent of its next one.
	CheckpointHead string `json:"checkpoint_head,omitempty"`
	// Files are the entries after this one, in order.
	Files []File `json:"files"`
}

// Checkpoint is one checkpoint an archive carries (Manifest.Checkpoints):
// its record's fields and where its images' data goes.
type Checkpoint struct {
	Name string `json:"name"`
	// Parent is "" (a root) or a checkpoint listed before this one.
	Parent       string    `json:"parent,omitempty"`
	Created      time.Time `json:"created"`
	PausedNs     int64     `json:"paused_ns,omitempty"`
	AgentVersion string    `json:"agent_version,omitempty"`
	// Disk places checkpoint.I.rw.ext4.data, RAM checkpoint.I.ram.data
	// (nil: no RAM image).
	Disk DiskMap  `json:"disk"`
	RAM  *DiskMap `json:"ram,omitempty"`
}

// CheckpointSource is a checkpoint for Write: its record's fields (Disk
// and RAM are filled in) and Dir, a whole snapshot directory of it
// (DiskFile, MachineFile, StateFile, RAMFile where there is one).
type CheckpointSource struct {
	Checkpoint
	Dir string
}

// MaxCheckpoints bounds the checkpoints an archive may carry: as many as
// a box keeps (checkpoint.MaxCheckpoints).
const MaxCheckpoints = checkpoint.MaxCheckpoints

// CheckpointEntry is the archive entry name of file base (DiskName,
// MachineFile, StateFile, RAMName) of checkpoint i.
func CheckpointEntry(i int, base string) string { return fmt.Sprintf("checkpoint.%d.%s", i, base) }

// CheckpointDir is where Extract puts checkpoint i's files under dir.
func CheckpointDir(dir string, i int) string {
	return filepath.Join(dir, fmt.Sprintf("checkpoint.%d", i))
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
// there is one, RAMFile), then the files of each of ckpts (a KindBox
// archive's checkpoints, each after its parent). It fills in m's
// Version, Disk, RAM, Checkpoints and Files. The files must not change
// while it runs (their checksums are taken before they are written); an
// error says which did.
func Write(ctx context.Context, w io.Writer, m Manifest, disk, snapDir string, ckpts []CheckpointSource) (Stats, error) {
	var st Stats
	m.Version = Version
	m.RAM, m.Checkpoints, m.Files = nil, nil, nil
	var srcs []*source
	defer func() {
		for _, s := range srcs {
			s.f.Close()
		}
	}()
	// add opens the entry name of path (sparse: its data ranges only)
	// and takes its checksum first: the manifest lists them.
	add := func(name, path string, sparse, optional bool) (*source, error) {
		f, err := os.Open(path)
		if err != nil {
			if optional && os.IsNotExist(err) {
				return nil, nil
			}
			return nil, err
		}
		s := &source{name: name, f: f, sparse: sparse}
		srcs = append(srcs, s)
		if sparse {
			if s.dm, err = dataExtents(f); err != nil {
				return nil, fmt.Errorf("map %s: %w", path, err)
			}
		} else {
			fi, err := f.Stat()
			if err != nil {
				return nil, err
			}
			s.dm = DiskMap{Size: fi.Size(), Extents: [][2]int64{{0, fi.Size()}}}
			if fi.Size() == 0 {
				s.dm.Extents = nil
			}
		}
		h := sha256.New()
		if err := copyExtents(ctx, h, f, s.dm); err != nil {
			return nil, err
		}
		m.Files = append(m.Files, File{Name: name, Size: extentsLen(s.dm), SHA256: hex.EncodeToString(h.Sum(nil))})
		return s, nil
	}
	d, err := add(DiskName, disk, true, false)
	if err != nil {
		return st, err
	}
	m.Disk = d.dm
	if snapDir != "" {
		for _, name := range []string{SnapshotFile, MachineFile, StateFile} {
			if _, err := add(name, filepath.Join(snapDir, name), false, false); err != nil {
				return st, err
			}
		}
		r, err := add(RAMName, filepath.Join(snapDir, RAMFile), true, true)
		if err != nil {
			return st, err
		}
		if r != nil {
			m.RAM = &r.dm
		}
	}
	for i, c := range ckpts {
		cd, err := add(CheckpointEntry(i, DiskName), filepath.Join(c.Dir, DiskFile), true, false)
		if err != nil {
			return st, fmt.Errorf("checkpoint %s: %w", c.Name, err)
		}
		c.Disk, c.RAM = cd.dm, nil
		for _, name := range []string{MachineFile, StateFile} {
			if _, err := add(CheckpointEntry(i, name), filepath.Join(c.Dir, name), false, false); err != nil {
				return st, fmt.Errorf("checkpoint %s: %w", c.Name, err)
			}
		}
		r, err := add(CheckpointEntry(i, RAMName), filepath.Join(c.Dir, RAMFile), true, true)
		if err != nil {
			return st, fmt.Errorf("checkpoint %s: %w", c.Name, err)
		}
		if r != nil {
			c.RAM = &r.dm
		}
		m.Checkpoints = append(m.Checkpoints, c.Checkpoint)
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
	for i, s := range srcs {
		size := m.Files[i].Size
		if err := hdr(s.name, size); err != nil {
			return st, err
		}
		if err := copyExtents(ctx, tw, s.f, s.dm); err != nil {
			return st, fmt.Errorf("%s changed while it was exported: %w", s.name, err)
		}
		switch {
		case i == 0:
			st.DiskBytes = size
		case s.name == StateFile || s.name == RAMName:
			st.StateBytes += size
		}
	}
	if err := tw.Close(); err != nil {
		return st, err
	}
	st.Bytes = cw.n
	return st, nil
}

// source is an entry Write writes: the data dm places of f.
type source struct {
	name   string
	f      *os.File
	sparse bool
	dm     DiskMap
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
	for i, af := range m.Files {
		if err := rd.next(af.Name, af.Size); err != nil {
			return err
		}
		p, dm, base, err := rd.dest(dir, i)
		if err != nil {
			return err
		}
		if dm != nil {
			if err := writeSparse(ctx, rd.tr, p, *dm, af); err != nil {
				return err
			}
			continue
		}
		if err := writeChecked(ctx, rd.tr, p, af); err != nil {
			return err
		}
		if rd.lim.CheckFile != nil && (base == SnapshotFile || base == MachineFile) {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := rd.lim.CheckFile(base, b); err != nil {
				if base != af.Name {
					return fmt.Errorf("the archive's %s: %w", af.Name, err)
				}
				return err
			}
		}
	}
	return nil
}

// dest returns where entry i of the manifest goes under dir: its path,
// its map if it is a sparse image (nil: a plain file), and its name in a
// snapshot directory's terms (SnapshotFile, MachineFile...). A
// checkpoint's directory is made as its first entry comes.
func (rd *Reader) dest(dir string, i int) (path string, dm *DiskMap, base string, err error) {
	m := &rd.m
	name := m.Files[i].Name
	at := dir
	if ci, b, ok := rd.checkpointEntry(name); ok {
		at, name = CheckpointDir(dir, ci), b
		c := &m.Checkpoints[ci]
		if name == DiskName {
			if err := os.Mkdir(at, 0o700); err != nil {
				return "", nil, "", err
			}
			return filepath.Join(at, DiskFile), &c.Disk, DiskFile, nil
		}
		if name == RAMName {
			return filepath.Join(at, RAMFile), c.RAM, RAMFile, nil
		}
		return filepath.Join(at, name), nil, name, nil
	}
	switch name {
	case DiskName:
		return filepath.Join(at, DiskFile), &m.Disk, DiskFile, nil
	case RAMName:
		return filepath.Join(at, RAMFile), m.RAM, RAMFile, nil
	}
	return filepath.Join(at, name), nil, name, nil
}

// checkpointEntry parses a checkpoint's entry name (one check accepted).
func (rd *Reader) checkpointEntry(name string) (i int, base string, ok bool) {
	if !strings.HasPrefix(name, "checkpoint.") {
		return 0, "", false
	}
	for i := range rd.m.Checkpoints {
		for _, b := range []string{DiskName, MachineFile, StateFile, RAMName} {
			if name == CheckpointEntry(i, b) {
				return i, b, true
			}
		}
	}
	return 0, "", false
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

// agentVersion is what Read accepts as a checkpoint's agent version.
var agentVersion = regexp.MustCompile(`^[A-Za-z0-9_.+-]{0,64}$`)

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
	d := m.Disk
	if d.Size != lim.DiskBytes {
		return fmt.Errorf("the archive's disk is %d bytes, not the %d MiB of its box's options", d.Size, lim.DiskBytes>>20)
	}
	data, err := checkExtents(d, "disk")
	if err != nil {
		return err
	}
	// The migration stream holds at most the guest's RAM, plus device
	// state.
	stateMax := lim.MemoryBytes + 256<<20
	limits := map[string]int64{DiskName: data, SnapshotFile: MaxJSON, MachineFile: MaxJSON, StateFile: stateMax}
	// exact are the entries whose size is their map's data.
	exact := map[string]bool{DiskName: true, RAMName: true}
	if m.RAM != nil {
		if m.RAM.Size != lim.MemoryBytes {
			return fmt.Errorf("the archive's RAM image is %d bytes, not the %d MiB of its box's options", m.RAM.Size, lim.MemoryBytes>>20)
		}
		if limits[RAMName], err = checkExtents(*m.RAM, "RAM image"); err != nil {
			return err
		}
	}
	if err := checkCheckpoints(m); err != nil {
		return err
	}
	for i, c := range m.Checkpoints {
		what := "checkpoint " + c.Name
		n := CheckpointEntry(i, DiskName)
		want = append(want, n, CheckpointEntry(i, MachineFile), CheckpointEntry(i, StateFile))
		if c.Disk.Size != lim.DiskBytes {
			return fmt.Errorf("the archive's %s has a disk of %d bytes, not the %d MiB of its box's options", what, c.Disk.Size, lim.DiskBytes>>20)
		}
		if limits[n], err = checkExtents(c.Disk, what+" disk"); err != nil {
			return err
		}
		exact[n] = true
		limits[CheckpointEntry(i, MachineFile)], limits[CheckpointEntry(i, StateFile)] = MaxJSON, stateMax
		if c.RAM != nil {
			n := CheckpointEntry(i, RAMName)
			want = append(want, n)
			if c.RAM.Size != lim.MemoryBytes {
				return fmt.Errorf("the archive's %s has a RAM image of %d bytes, not the %d MiB of its box's options", what, c.RAM.Size, lim.MemoryBytes>>20)
			}
			if limits[n], err = checkExtents(*c.RAM, what+" RAM image"); err != nil {
				return err
			}
			exact[n] = true
		}
	}
	if len(m.Files) != len(want) {
		return fmt.Errorf("the archive lists %d entries, not the %d of a %s archive with %d checkpoints", len(m.Files), len(want), m.Kind, len(m.Checkpoints))
	}
	for i, af := range m.Files {
		if af.Name != want[i] {
			return fmt.Errorf("the archive lists entry %q where %s belongs", af.Name, want[i])
		}
		if af.Size < 0 || af.Size > limits[af.Name] || exact[af.Name] && af.Size != limits[af.Name] {
			return fmt.Errorf("the archive's %s is %d bytes, over what its box allows (%d): %w", af.Name, af.Size, limits[af.Name], ErrLimit)
		}
		if b, err := hex.DecodeString(af.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("the archive's %s has no valid SHA-256", af.Name)
		}
	}
	return nil
}

// checkCheckpoints checks the checkpoints m lists: only a box archive
// has them, at most MaxCheckpoints, with valid distinct names, each
// parent "" or a checkpoint listed before it (so that they form a tree:
// no loop, no parent missing), the head "" or one of them.
func checkCheckpoints(m *Manifest) error {
	if len(m.Checkpoints) == 0 {
		if m.CheckpointHead != "" {
			return fmt.Errorf("the archive names a current checkpoint but has none")
		}
		return nil
	}
	if m.Kind != KindBox {
		return fmt.Errorf("the archive carries checkpoints but is not of a box without memory: not an archive Box.Export wrote")
	}
	if len(m.Checkpoints) > MaxCheckpoints {
		return fmt.Errorf("the archive carries %d checkpoints, more than the %d a box keeps: %w", len(m.Checkpoints), MaxCheckpoints, ErrLimit)
	}
	seen := make(map[string]bool, len(m.Checkpoints))
	for _, c := range m.Checkpoints {
		if err := checkpoint.CheckName(c.Name); err != nil {
			return fmt.Errorf("the archive's %w", err)
		}
		if seen[c.Name] {
			return fmt.Errorf("the archive carries checkpoint %s twice", c.Name)
		}
		if c.Parent != "" && !seen[c.Parent] {
			if err := checkpoint.CheckName(c.Parent); err != nil {
				return fmt.Errorf("the archive's checkpoint %s has a parent that is no %w", c.Name, err)
			}
			return fmt.Errorf("the archive's checkpoint %s has parent %s, which is not a checkpoint listed before it (a loop, or one missing): not an archive Box.Export wrote", c.Name, c.Parent)
		}
		if c.PausedNs < 0 || !agentVersion.MatchString(c.AgentVersion) {
			return fmt.Errorf("the archive's checkpoint %s has a bad record (paused %d ns, or an agent version that is not 0-64 letters, digits, '.', '_', '-', '+')", c.Name, c.PausedNs)
		}
		seen[c.Name] = true
	}
	if m.CheckpointHead != "" && !seen[m.CheckpointHead] {
		return fmt.Errorf("the archive's current checkpoint is not one it carries")
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
