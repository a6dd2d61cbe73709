package airlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"time"

	"github.com/airlock-run/airlock/internal/boxarchive"
	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/lifecycle"
	"github.com/airlock-run/airlock/internal/snapmeta"
	"github.com/airlock-run/airlock/internal/vmm"
)

// A box archive (Box.Export, ImportBox) is internal/boxarchive's format;
// this file makes one of a box or snapshot, and a box or snapshot of one:
// it decodes and bounds the box configuration the archive carries, and
// records what it read.

// ExportOptions tune Box.Export.
type ExportOptions struct {
	// Memory takes a memory snapshot of the running box (as Snapshot:
	// the box is paused briefly and runs on) and puts it in the archive:
	// ImportBox then starts the box where it was, processes included.
	Memory bool
	// Checkpoints puts the box's checkpoints in the archive (each whole:
	// what the box stores as changes against its parent is filled in),
	// with their tree: ImportBox gives them to the new box, which can
	// roll back to them. Not with Memory (ErrInvalidArgument).
	Checkpoints bool
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
	if opts.Memory && opts.Checkpoints {
		return ExportStats{}, fmt.Errorf("export box %s: checkpoints go only in an archive without memory (take a checkpoint instead of the memory export): %w", b.id, ErrInvalidArgument)
	}
	if opts.Memory {
		name := snapmeta.TempName("export-" + b.id)
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
	_, cfg := b.snapshot()
	ast, paused, err := b.eng.Export(ctx, w, filepath.Join(b.r.opts.Home, "tmp"), rec, encodeConfig(cfg), opts.Checkpoints, b.r.seal(), b.load, b.syncGuest)
	st := exportStats(ast)
	st.Paused = paused
	return st, err
}

// ExportSnapshot writes snapshot name as an archive with memory to w
// (see Box.Export). Errors: ErrSnapshotNotFound.
func (r *Runtime) ExportSnapshot(ctx context.Context, name string, w io.Writer) (ExportStats, error) {
	return r.exportSnapshot(ctx, name, name, w)
}

// exportSnapshot exports snapshot name, calling it label in the archive
// (lifecycle.Maker.ExportSnapshot).
func (r *Runtime) exportSnapshot(ctx context.Context, name, label string, w io.Writer) (ExportStats, error) {
	st, err := r.maker(nil, "").ExportSnapshot(ctx, name, label, w, r.seal())
	return exportStats(st), err
}

// seal is the driver's SealSnapshot (nil when it has none): the digests
// of a snapshot's boot files, for a restore on another host.
func (r *Runtime) seal() func(context.Context, string) error {
	if s, ok := r.drv.(vmm.SnapshotSealer); ok {
		return s.SealSnapshot
	}
	return nil
}

func exportStats(s boxarchive.Stats) ExportStats {
	return ExportStats{Bytes: s.Bytes, DiskBytes: s.DiskBytes, StateBytes: s.StateBytes}
}

// ImportOptions tune ImportBox.
type ImportOptions struct {
	// Name names the new box ("" for none).
	Name string
	// Snapshot names the snapshot an archive with memory is stored as
	// (default: the archive's snapshot name, or "import-<box id>").
	Snapshot string
	// Admit, when set, is called once the archive's manifest is read and
	// checked, before anything is written: opts are the new box's options
	// as decoded from the archive (defaults filled in, Name set), memory
	// tells an archive with memory, checkpoints how many checkpoints it
	// carries (both hold device state that QEMU loads: see ImportBox).
	// Its error ends the import, unwrapped. It may set opts.Labels (a
	// server adds its tenant's label); changes to other fields are not
	// kept. A server applies its policy here.
	Admit func(opts *BoxOptions, memory bool, checkpoints int) error
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
// An archive written with checkpoints (ExportOptions.Checkpoints) gives
// them to the new box, tree, names and current one as they were; a
// checkpoint is restored only by Rollback, which runs QEMU on its device
// state as an import with memory does. Published ports, volumes and host
// ports the box may reach name host resources and are not carried. The archive is hostile input: only its
// fixed entries, in order, as plain (not sparse) files of the sizes and
// checksums it declares, within the box's disk and memory sizes, are
// accepted, for a box whose memory is within the host memory cap
// (CapacityError), whose disk is at most 1 TiB, and whose entries fit the
// home's free space; a memory archive's kernel command line may hold only
// the parameters airlock writes (the QEMU driver's CheckCmdline: no init=, module
// parameters or "--" tail), as each checkpoint's; at most 64 checkpoints,
// named as Checkpoint names them, each listed after its parent (a tree:
// no loop, no missing parent); anything else is refused with an error
// (wrapping ErrInvalidArgument when the manifest is refused, ErrLimit for
// sizes). Importing memory runs QEMU on the
// archive's device state, which QEMU does not treat as untrusted: import
// archives with memory only from hosts you trust.
func (r *Runtime) ImportBox(ctx context.Context, rd io.Reader, opts ImportOptions) (ImportResult, error) {
	var o BoxOptions
	var admitErr error
	b, snap, err := r.maker(&o, "").Import(ctx, rd, opts.Snapshot, func(m *boxarchive.Manifest) (boxarchive.Limits, error) {
		var err error
		if o, err = archiveOptions(m, opts.Name); err != nil {
			return boxarchive.Limits{}, err
		}
		// Memory and disk sizes are the archive's: hold them to this
		// host's bounds before they size anything.
		if err := r.checkMemoryCap(o.MemoryMiB); err != nil {
			return boxarchive.Limits{}, fmt.Errorf("the archive's box: %w", err)
		}
		if opts.Admit != nil {
			admitted := o
			admitted.Labels = maps.Clone(o.Labels)
			if err := opts.Admit(&admitted, m.Kind == boxarchive.KindSnapshot, len(m.Checkpoints)); err != nil {
				admitErr = err
				return boxarchive.Limits{}, err
			}
			o.Labels = admitted.Labels
		}
		return boxarchive.BoxLimits(o.MemoryMiB, o.DiskSizeMiB, boxarchive.CheckSnapshotFile(r.checkMachineFile))
	}, func(img *image.Image) []byte {
		return encodeConfig(boxConfig{Options: o, Meta: boxopts.Meta{Image: img.Config}})
	}, func(ctx context.Context, name string) (*Box, error) {
		b, err := r.Create(ctx, BoxOptions{FromSnapshot: name, Name: opts.Name})
		if err != nil && !errors.Is(err, ErrNameInUse) {
			err = fmt.Errorf("import: %w (memory archives restore only where the kernel, agent disk and root filesystem base have the content, and QEMU the version and machine layout, of the exporting host's; export the box without memory to move it)", err)
		}
		return b, err
	})
	var refused *lifecycle.ArchiveError
	if err != nil && errors.As(err, &refused) && (admitErr == nil || refused.Err != admitErr) {
		// Not an archive this airlock reads, or one past its bounds.
		return ImportResult{}, fmt.Errorf("%w: %w", ErrInvalidArgument, refused.Err)
	}
	if err != nil {
		return ImportResult{}, err
	}
	return ImportResult{Box: b, Snapshot: snap}, nil
}

// archiveOptions decodes and checks the box configuration m carries: the
// options of the imported box, named name (boxopts.Archived).
func archiveOptions(m *boxarchive.Manifest, name string) (BoxOptions, error) {
	if err := checkBoxName(m.BoxName); err != nil {
		return BoxOptions{}, fmt.Errorf("the archive's box: %w: not an archive Box.Export wrote", err)
	}
	o, err := boxopts.Archived(m.Config, name, m.Image)
	return public(o), err
}

// checkMachineFile checks a memory archive's machine.json: the driver's
// to check (vmm.MachineFileChecker; boxarchive.CheckSnapshotFile).
func (r *Runtime) checkMachineFile(b []byte) error {
	c, ok := r.drv.(vmm.MachineFileChecker)
	if !ok {
		return fmt.Errorf("archives with memory: %w (driver %s)", vmm.ErrNotSupported, r.drv.Name())
	}
	if err := c.CheckMachineFile(b); err != nil {
		return fmt.Errorf("the archive's %w", err)
	}
	return nil
}

// IsBoxArchive reports whether r starts like a box archive (Box.Export):
// a tar whose first entry is its airlock-box.json. It reads r's first
// header.
func IsBoxArchive(r io.Reader) bool { return boxarchive.IsArchive(r) }
