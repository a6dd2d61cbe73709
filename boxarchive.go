package airlock

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/scratch"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// A box archive (Box.Export, ImportBox) is a plain tar of fixed entries:
//
//	airlock-box.json   archiveMeta: what the box is, and the entries below
//	rw.ext4.data       the writable layer's data ranges, back to back
//	                   (archiveMeta.Disk lists where each goes; holes are
//	                   left out, so a 4 GiB disk with 20 MiB of data takes
//	                   20 MiB)
//
// and, for an archive with memory (a snapshot):
//
//	snapshot.json      the snapshot's metadata (snapshotMeta)
//	machine.json       the driver's machine description
//	state              the memory and device state
//	ram.data           only where the snapshot has a RAM image (guest RAM
//	                   kept out of the state, see internal/vmm/qemu
//	                   ramimage.go): its data ranges, back to back, placed
//	                   by archiveMeta.RAM as rw.ext4.data by Disk
//
// No entry name becomes a path: ImportBox accepts exactly these names, in
// this order, as regular files of the sizes airlock-box.json declares, and
// checks each one's SHA-256.
const (
	archiveMetaName = "airlock-box.json"
	archiveDiskName = "rw.ext4.data"
	archiveVersion  = 1
	// maxArchiveJSON bounds each JSON entry of an archive.
	maxArchiveJSON = 1 << 20
)

// archiveMeta is airlock-box.json.
type archiveMeta struct {
	Version int `json:"v"`
	// Kind is "box" (configuration and writable layer) or "snapshot"
	// (also memory and device state).
	Kind        string          `json:"kind"`
	Box         string          `json:"box"`
	BoxName     string          `json:"box_name,omitempty"`
	Snapshot    string          `json:"snapshot,omitempty"`
	Image       string          `json:"image"`
	ImageDigest string          `json:"image_digest"`
	Config      json.RawMessage `json:"config"` // the box's boxRecord
	Exported    time.Time       `json:"exported"`
	Disk        diskMap         `json:"disk"`
	// RAM places ram.data (a snapshot with a RAM image); nil: none.
	RAM *diskMap `json:"ram,omitempty"`
	// Files are the entries after this one, in order.
	Files []archiveFile `json:"files"`
}

// diskMap places rw.ext4.data: Extents are [offset, length] pairs in
// ascending order within Size.
type diskMap struct {
	Size    int64      `json:"size"`
	Extents [][2]int64 `json:"extents"`
}

type archiveFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// ExportOptions tune Box.Export.
type ExportOptions struct {
	// Memory takes a memory snapshot of the running box (as Snapshot:
	// the box is paused briefly and runs on) and puts it in the archive:
	// ImportBox then starts the box where it was, processes included.
	Memory bool
}

// ExportStats describes an archive written by Export or ExportSnapshot.
type ExportStats struct {
	// Bytes is the archive's size; DiskBytes the writable layer's data in
	// it, StateBytes the memory and device state (0 without memory).
	Bytes, DiskBytes, StateBytes int64
	// Paused is how long the box was paused (a running box's disk copy or
	// memory snapshot).
	Paused time.Duration
}

// Export writes the box as an archive to w: its configuration and its
// writable layer (what it changed in its image; volumes are not part of
// it), and with opts.Memory its memory. ImportBox on this or another
// host with the same image makes a box of it. A running box is flushed
// (sync in the guest) and paused while its disk is copied, or snapshotted
// with Memory. Errors: ErrBoxNotRunning for Memory on a stopped box, and
// those of Snapshot.
func (b *Box) Export(ctx context.Context, w io.Writer, opts ExportOptions) (ExportStats, error) {
	if opts.Memory {
		var rnd [4]byte
		rand.Read(rnd[:])
		name := "export-" + b.id + "-" + hex.EncodeToString(rnd[:])
		info, err := b.Snapshot(ctx, name)
		if err != nil {
			return ExportStats{}, err
		}
		defer b.r.RemoveSnapshot(context.WithoutCancel(ctx), name)
		// The archive's snapshot takes the box's name (or id), not the
		// temporary one.
		label := b.Name()
		if label == "" {
			label = b.id
		}
		st, err := b.r.exportSnapshot(ctx, name, label, w)
		st.Paused = info.Paused
		return st, err
	}
	rec, err := b.load(ctx)
	if err != nil {
		return ExportStats{}, err
	}
	scratch := filepath.Join(b.r.opts.Home, "tmp")
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return ExportStats{}, err
	}
	disk, paused, cleanup, err := b.stableDisk(ctx, scratch)
	if err != nil {
		return ExportStats{}, err
	}
	defer cleanup()
	_, cfg := b.snapshot()
	m := archiveMeta{Version: archiveVersion, Kind: "box", Box: b.id, BoxName: rec.Name, Image: rec.Image,
		ImageDigest: rec.ImageDigest, Config: encodeConfig(cfg), Exported: time.Now().UTC()}
	st, err := writeArchive(ctx, w, m, disk, "")
	st.Paused = paused
	if err != nil {
		return st, fmt.Errorf("export box %s: %w", b.id, err)
	}
	return st, nil
}

// ExportSnapshot writes snapshot name as an archive with memory to w
// (see Box.Export). Errors: ErrSnapshotNotFound.
func (r *Runtime) ExportSnapshot(ctx context.Context, name string, w io.Writer) (ExportStats, error) {
	return r.exportSnapshot(ctx, name, name, w)
}

// exportSnapshot exports snapshot name, calling it label in the archive.
func (r *Runtime) exportSnapshot(ctx context.Context, name, label string, w io.Writer) (ExportStats, error) {
	sm, err := r.readSnapshot(name)
	if err != nil {
		return ExportStats{}, err
	}
	lk := r.snapshotLock(name)
	if err := lockWith(ctx, "snapshot "+name, lk.TryRLockContext); err != nil {
		return ExportStats{}, err
	}
	defer lk.Unlock()
	dir := filepath.Join(r.snapshotsDir(), name)
	// The boot files' content digests, so that another host with the same
	// files (the same image, agent and kernel) can restore it.
	if s, ok := r.drv.(vmm.SnapshotSealer); ok {
		if err := s.SealSnapshot(ctx, dir); err != nil {
			return ExportStats{}, fmt.Errorf("export snapshot %s: %w", name, err)
		}
	}
	m := archiveMeta{Version: archiveVersion, Kind: "snapshot", Box: sm.Box, BoxName: sm.BoxName, Snapshot: label,
		Image: sm.Image, ImageDigest: sm.ImageDigest, Config: sm.Config, Exported: time.Now().UTC()}
	st, err := writeArchive(ctx, w, m, filepath.Join(dir, snapDiskFile), dir)
	if err != nil {
		return st, fmt.Errorf("export snapshot %s: %w", name, err)
	}
	return st, nil
}

// The files of a snapshot directory the archive carries besides its disk
// (the driver's names: internal/vmm/qemu snapshot.go).
const (
	snapDiskFile    = "rw.ext4"
	snapMachineFile = "machine.json"
	snapStateFile   = "state"
	snapRAMFile     = "ram"
	archiveRAMName  = "ram.data"
)

// writeArchive writes m's archive: the disk's data, then (snapDir != "")
// the snapshot's files.
func writeArchive(ctx context.Context, w io.Writer, m archiveMeta, disk, snapDir string) (ExportStats, error) {
	var st ExportStats
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
	var dataLen int64
	for _, e := range dm.Extents {
		dataLen += e[1]
	}
	// Checksums first: the header entry lists them.
	sum := sha256.New()
	if err := copyExtents(ctx, sum, f, dm); err != nil {
		return st, err
	}
	m.Files = []archiveFile{{Name: archiveDiskName, Size: dataLen, SHA256: hex.EncodeToString(sum.Sum(nil))}}
	var ram *os.File
	if snapDir != "" {
		for _, name := range []string{snapshotMetaFile, snapMachineFile, snapStateFile} {
			af, err := hashFile(ctx, filepath.Join(snapDir, name))
			if err != nil {
				return st, err
			}
			af.Name = name
			m.Files = append(m.Files, af)
		}
		if ram, err = os.Open(filepath.Join(snapDir, snapRAMFile)); err == nil {
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
			m.Files = append(m.Files, archiveFile{Name: archiveRAMName, Size: extentsLen(rm), SHA256: hex.EncodeToString(sum.Sum(nil))})
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
	if err := hdr(archiveMetaName, int64(len(raw))); err != nil {
		return st, err
	}
	if _, err := tw.Write(raw); err != nil {
		return st, err
	}
	if err := hdr(archiveDiskName, dataLen); err != nil {
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
		if af.Name == archiveRAMName {
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
		if af.Name == snapStateFile {
			st.StateBytes += af.Size
		}
	}
	if err := tw.Close(); err != nil {
		return st, err
	}
	st.Bytes = cw.n
	return st, nil
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

func hashFile(ctx context.Context, p string) (archiveFile, error) {
	f, err := os.Open(p)
	if err != nil {
		return archiveFile{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, ctxReader{ctx, f})
	if err != nil {
		return archiveFile{}, err
	}
	return archiveFile{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
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
func extentsLen(dm diskMap) int64 {
	var n int64
	for _, e := range dm.Extents {
		n += e[1]
	}
	return n
}

// dataExtents maps f's data (SEEK_DATA / SEEK_HOLE).
func dataExtents(f *os.File) (diskMap, error) {
	fi, err := f.Stat()
	if err != nil {
		return diskMap{}, err
	}
	dm := diskMap{Size: fi.Size(), Extents: [][2]int64{}}
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

func copyExtents(ctx context.Context, w io.Writer, f *os.File, dm diskMap) error {
	for _, e := range dm.Extents {
		if _, err := io.Copy(w, ctxReader{ctx, io.NewSectionReader(f, e[0], e[1])}); err != nil {
			return err
		}
	}
	return nil
}

// ImportOptions tune ImportBox.
type ImportOptions struct {
	// Name names the new box ("" for none).
	Name string
	// Snapshot names the snapshot an archive with memory is stored as
	// (default: the archive's snapshot name, or "import-<box id>").
	Snapshot string
}

// ImportResult is what ImportBox made.
type ImportResult struct {
	Box *Box
	// Snapshot is the snapshot an archive with memory was stored as
	// (kept: more boxes can be restored from it; remove it with
	// RemoveSnapshot). "" for an archive without memory.
	Snapshot string
}

// ImportBox makes a box of an archive written by Box.Export, read from
// rd. Without memory the box is created stopped, with the archive's
// options and writable layer: Start boots it with its files. With memory
// the archive is stored as a snapshot and a box restored from it, running
// (restore checks the kernel, agent disk or initramfs, root filesystem base,
// QEMU version and machine layout as a local snapshot's restore does, and
// fails saying which differs; on another host the boot files are compared
// by content: the export records their SHA-256, and they are built
// reproducibly, so a host with the same image, agent, kernel, erofs-utils
// and QEMU restores it). The archive's image (its digest) must be in the image store.
// Published ports, volumes and host ports the box may reach name host
// resources and are not carried. The archive is hostile input: only its
// fixed entries, in order, as plain (not sparse) files of the sizes and
// checksums it declares, within the box's disk and memory sizes, are
// accepted, for a box whose memory is within the host memory cap
// (CapacityError), whose disk is at most 1 TiB, and whose entries fit the
// home's free space; a memory archive's kernel command line may hold only
// the parameters airlock writes (qemu.CheckCmdline: no init=, module
// parameters or "--" tail); anything else is refused with an error
// (ErrLimit for sizes). Importing memory runs QEMU on the
// archive's device state, which QEMU does not treat as untrusted: import
// archives with memory only from hosts you trust.
func (r *Runtime) ImportBox(ctx context.Context, rd io.Reader, opts ImportOptions) (ImportResult, error) {
	var res ImportResult
	tr := tar.NewReader(rd)
	next := func(want string, size int64) error {
		h, err := tr.Next()
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
		// archive/tar expands a GNU sparse entry (PAX GNU.sparse.*
		// records) to its declared size, holes as zeros, without bound:
		// a few KiB of archive would write gigabytes here. Export never
		// writes one.
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
	if err := next(archiveMetaName, -1); err != nil {
		return res, err
	}
	raw, err := io.ReadAll(io.LimitReader(tr, maxArchiveJSON+1))
	if err != nil {
		return res, err
	}
	if len(raw) > maxArchiveJSON {
		return res, fmt.Errorf("%s is larger than %d bytes: %w", archiveMetaName, maxArchiveJSON, ErrLimit)
	}
	var m archiveMeta
	if err := json.Unmarshal(raw, &m); err != nil {
		return res, fmt.Errorf("%s: %w", archiveMetaName, err)
	}
	if m.Version != archiveVersion {
		return res, fmt.Errorf("archive format version %d is not one this airlock reads (%d)", m.Version, archiveVersion)
	}
	brec, err := decodeRecord(m.Config)
	if err != nil {
		return res, fmt.Errorf("the archive's box configuration: %w", err)
	}
	cfg, err := brec.config()
	if err != nil {
		return res, fmt.Errorf("the archive's box configuration: %w", err)
	}
	o := cfg.Options
	// What names host resources, or this host's owner, stays here.
	o.Volumes, o.Ports, o.AllowHostPorts, o.AutoRemove, o.FromSnapshot = nil, nil, nil, false, ""
	o.Name = opts.Name
	o.Image = m.Image
	if o, err = withDefaults(o); err != nil {
		return res, fmt.Errorf("the archive's box configuration: %w", err)
	}
	// Memory and disk sizes are the archive's: hold them to this host's
	// bounds before they size anything.
	if err := r.checkMemoryCap(o.MemoryMiB); err != nil {
		return res, fmt.Errorf("the archive's box: %w", err)
	}
	if err := checkArchive(m, o); err != nil {
		return res, err
	}
	if err := checkFreeSpace(r.opts.Home, m); err != nil {
		return res, err
	}
	img, err := r.images.Resolve(m.ImageDigest)
	if err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return res, fmt.Errorf("the archive's image %s (%s) is not in the image store: pull or import that image first: %w", m.Image, m.ImageDigest, ErrImageNotFound)
		}
		return res, err
	}
	if img.Digest != m.ImageDigest {
		return res, fmt.Errorf("the archive's image %s resolved to %s here: %w", m.ImageDigest, img.Digest, ErrImageNotFound)
	}
	readDisk := func(dst string) error {
		if err := next(archiveDiskName, m.Files[0].Size); err != nil {
			return err
		}
		return writeDisk(ctx, tr, dst, m.Disk, m.Files[0].SHA256)
	}
	if m.Kind == "box" {
		// The disk is read and checked before the box is recorded: an
		// import that fails, or is killed, midway leaves no half box.
		tmp, err := scratch.MkdirTemp(filepath.Join(r.opts.Home, "tmp"), "import")
		if errors.Is(err, os.ErrNotExist) {
			if err = os.MkdirAll(filepath.Join(r.opts.Home, "tmp"), 0o700); err == nil {
				tmp, err = scratch.MkdirTemp(filepath.Join(r.opts.Home, "tmp"), "import")
			}
		}
		if err != nil {
			return res, err
		}
		defer os.RemoveAll(tmp)
		disk := filepath.Join(tmp, boxdir.RW)
		if err := readDisk(disk); err != nil {
			return res, fmt.Errorf("import box: %w", err)
		}
		b, err := r.recordBox(ctx, o, img, func(ctx context.Context, spec vmm.Spec) error {
			dst := filepath.Join(spec.Dir, boxdir.RW)
			if os.Rename(disk, dst) == nil {
				return nil
			}
			return rootfs.CopyDisk(disk, dst) // another filesystem
		})
		if err != nil {
			return res, fmt.Errorf("import box: %w", err)
		}
		res.Box = b
		return res, nil
	}

	// An archive with memory: a snapshot first.
	name := opts.Snapshot
	if name == "" {
		name = m.Snapshot
		if name == "" || !snapshotName.MatchString(name) {
			name = "import-" + m.Box
		}
	}
	if err := checkSnapshotName(name); err != nil {
		return res, err
	}
	dir := r.snapshotsDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	lk := r.snapshotLock(name)
	if err := lockWith(ctx, "snapshot "+name, lk.TryLockContext); err != nil {
		return res, err
	}
	final := filepath.Join(dir, name)
	if _, err := os.Stat(final); err == nil {
		lk.Unlock()
		return res, fmt.Errorf("%w: %q (remove it, or import with another snapshot name)", ErrSnapshotExists, name)
	}
	err = func() (err error) {
		defer func() {
			lk.Unlock()
			if err != nil {
				// No snapshot of that name: its lock file goes too
				// (as RemoveSnapshot's).
				os.Remove(lk.Path())
			}
		}()
		tmp, err := scratch.MkdirTemp(dir, "import-"+name)
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := readDisk(filepath.Join(tmp, snapDiskFile)); err != nil {
			return err
		}
		var sm snapshotMeta
		for _, af := range m.Files[1:] {
			if err := next(af.Name, af.Size); err != nil {
				return err
			}
			if af.Name == archiveRAMName {
				if err := writeDisk(ctx, tr, filepath.Join(tmp, snapRAMFile), *m.RAM, af.SHA256); err != nil {
					return err
				}
				continue
			}
			p := filepath.Join(tmp, af.Name)
			if err := writeChecked(ctx, tr, p, af); err != nil {
				return err
			}
			if af.Name == snapMachineFile {
				// Its kernel command line reaches QEMU's -append.
				b, _ := os.ReadFile(p)
				if err := qemu.CheckMachineFile(b); err != nil {
					return fmt.Errorf("the archive's %w", err)
				}
			}
			if af.Name == snapshotMetaFile {
				b, _ := os.ReadFile(p)
				if err := json.Unmarshal(b, &sm); err != nil {
					return fmt.Errorf("archive's %s: %w", snapshotMetaFile, err)
				}
				// Kept in the snapshot's record and shown by inspect.
				if !printable(sm.AgentVersion, 64) || !printable(sm.Driver, 32) || sm.PausedNs < 0 {
					return fmt.Errorf("the archive's %s has an agent version %q, driver %q or pause %d ns that no snapshot has: not an archive Box.Export wrote", snapshotMetaFile, sm.AgentVersion, sm.Driver, sm.PausedNs)
				}
			}
		}
		// The snapshot's record is rebuilt from what was checked here,
		// not taken from the archive.
		sm = snapshotMeta{Version: 1, Name: name, Box: m.Box, BoxName: m.BoxName, Created: sm.Created,
			Image: m.Image, ImageDigest: m.ImageDigest, Config: encodeConfig(boxConfig{Options: o, Image: img.Config}),
			AgentVersion: sm.AgentVersion, Driver: sm.Driver, StateBytes: allocatedBytes(filepath.Join(tmp, snapStateFile)) + allocatedBytes(filepath.Join(tmp, snapRAMFile)),
			DiskBytes: allocatedBytes(filepath.Join(tmp, snapDiskFile)), PausedNs: sm.PausedNs}
		b, _ := json.MarshalIndent(sm, "", "  ")
		if err := os.WriteFile(filepath.Join(tmp, snapshotMetaFile), b, 0o600); err != nil {
			return err
		}
		return os.Rename(tmp, final)
	}()
	if err != nil {
		return res, fmt.Errorf("import snapshot %s: %w", name, err)
	}
	b, err := r.Create(ctx, BoxOptions{FromSnapshot: name, Name: opts.Name})
	if err != nil {
		// A snapshot this host cannot restore is of no use here.
		r.RemoveSnapshot(context.WithoutCancel(ctx), name)
		if errors.Is(err, ErrNameInUse) {
			return res, err
		}
		return res, fmt.Errorf("import: %w (memory archives restore only where the kernel, agent disk and root filesystem base have the content, and QEMU the version and machine layout, of the exporting host's; export the box without memory to move it)", err)
	}
	res.Snapshot = name
	res.Box = b
	return res, nil
}

var imageDigest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// archiveBoxID is what ImportBox accepts as the exported box's id: one
// that "import-"+id makes a snapshot name of.
var archiveBoxID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,55}$`)

// printable reports whether s is at most max bytes of printable text
// (spaces allowed; no control characters, no invalid UTF-8).
func printable(s string, max int) bool {
	if len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if !unicode.IsPrint(c) {
			return false
		}
	}
	return true
}

// checkArchive checks m's declared layout against the box's options o.
func checkArchive(m archiveMeta, o BoxOptions) error {
	if m.Kind != "box" && m.Kind != "snapshot" {
		return fmt.Errorf("archive kind %q is not one this airlock reads (box, snapshot)", m.Kind)
	}
	// The box's id and name are listed with the imported snapshot
	// (airlock snapshot ls prints the id): no terminal escapes.
	if !archiveBoxID.MatchString(m.Box) {
		return fmt.Errorf("the archive's box id %q is not a box id (letters, digits, '.', '_', '-', at most 56): not an archive Box.Export wrote", m.Box)
	}
	if err := checkBoxName(m.BoxName); err != nil {
		return fmt.Errorf("the archive's box: %w: not an archive Box.Export wrote", err)
	}
	if _, err := image.Normalize(m.Image); err != nil || !imageDigest.MatchString(m.ImageDigest) {
		return fmt.Errorf("the archive names image %q (%q): not an image reference and digest", m.Image, m.ImageDigest)
	}
	want := []string{archiveDiskName}
	if m.Kind == "snapshot" {
		want = append(want, snapshotMetaFile, snapMachineFile, snapStateFile)
		if m.RAM != nil {
			want = append(want, archiveRAMName)
		}
	} else if m.RAM != nil {
		return fmt.Errorf("the archive places a RAM image but is not of a snapshot")
	}
	if len(m.Files) != len(want) {
		return fmt.Errorf("the archive lists %d entries, not the %d of a %s archive", len(m.Files), len(want), m.Kind)
	}
	if o.DiskSizeMiB > maxArchiveDiskMiB {
		return fmt.Errorf("the archive's box has a disk of %d MiB, more than the %d MiB (1 TiB) an imported box may have: %w", o.DiskSizeMiB, maxArchiveDiskMiB, ErrLimit)
	}
	d := m.Disk
	if d.Size != int64(o.DiskSizeMiB)<<20 {
		return fmt.Errorf("the archive's disk is %d bytes, not the %d MiB of its box's options", d.Size, o.DiskSizeMiB)
	}
	data, err := checkExtents(d, "disk")
	if err != nil {
		return err
	}
	limits := map[string]int64{archiveDiskName: data, snapshotMetaFile: maxArchiveJSON, snapMachineFile: maxArchiveJSON,
		// The migration stream holds at most the guest's RAM, plus
		// device state.
		snapStateFile: int64(o.MemoryMiB)<<20 + 256<<20}
	if m.RAM != nil {
		if m.RAM.Size != int64(o.MemoryMiB)<<20 {
			return fmt.Errorf("the archive's RAM image is %d bytes, not the %d MiB of its box's options", m.RAM.Size, o.MemoryMiB)
		}
		if limits[archiveRAMName], err = checkExtents(*m.RAM, "RAM image"); err != nil {
			return err
		}
	}
	for i, af := range m.Files {
		if af.Name != want[i] {
			return fmt.Errorf("the archive lists entry %q where %s belongs", af.Name, want[i])
		}
		if af.Size < 0 || af.Size > limits[af.Name] || (af.Name == archiveDiskName || af.Name == archiveRAMName) && af.Size != limits[af.Name] {
			return fmt.Errorf("the archive's %s is %d bytes, over what its box allows (%d): %w", af.Name, af.Size, limits[af.Name], ErrLimit)
		}
		if b, err := hex.DecodeString(af.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("the archive's %s has no valid SHA-256", af.Name)
		}
	}
	return nil
}

// maxArchiveDiskMiB bounds the disk size of an imported box (the
// server API's bound on DiskSizeMiB): the guest may fill that much of the
// host's disk.
const maxArchiveDiskMiB = 1 << 20

// checkFreeSpace refuses an archive whose entries (checked by
// checkArchive) need more space than home's filesystem has free; a
// snapshot's disk is copied once more into the box restored from it.
func checkFreeSpace(home string, m archiveMeta) error {
	var need int64
	for _, af := range m.Files {
		need += af.Size
	}
	if m.Kind == "snapshot" {
		need += m.Files[0].Size
	}
	var st unix.Statfs_t
	if err := unix.Statfs(home, &st); err != nil {
		return nil // the writes will say
	}
	if free := int64(st.Bavail) * int64(st.Bsize); need > free {
		return fmt.Errorf("the archive needs %d MiB and the airlock home %s has %d MiB free: free some space first (or import into another home): %w", need>>20, home, free>>20, ErrLimit)
	}
	return nil
}

// checkExtents checks that dm's ranges are in order within its size and
// returns the bytes of data they place.
func checkExtents(dm diskMap, what string) (int64, error) {
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

// writeDisk makes dst a sparse file of dm.Size with the archive's data
// ranges at their offsets, checking their SHA-256.
func writeDisk(ctx context.Context, r io.Reader, dst string, dm diskMap, sum string) (err error) {
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
			return fmt.Errorf("the archive's disk data ends early")
		}
	}
	return checkSum(h, sum, archiveDiskName)
}

func writeChecked(ctx context.Context, r io.Reader, dst string, af archiveFile) (err error) {
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

func allocatedBytes(p string) int64 {
	var s unix.Stat_t
	if unix.Stat(p, &s) != nil {
		return 0
	}
	return s.Blocks * 512
}

// IsBoxArchive reports whether r starts like a box archive (Box.Export):
// a tar whose first entry is its airlock-box.json. It reads r's first
// header.
func IsBoxArchive(r io.Reader) bool {
	h, err := tar.NewReader(r).Next()
	return err == nil && h.Name == archiveMetaName
}
