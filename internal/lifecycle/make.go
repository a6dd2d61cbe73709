package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/boxarchive"
	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/snapmeta"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Maker is the runtime's side of the sequences that make boxes of a
// snapshot, an archive or a running box (Restore, Import, Fork); B is
// its box (the root package's *Box). What a box is, its record and its
// events stay the runtime's: the funcs below.
type Maker[B any] struct {
	Home, Snapshots string // the home, and its snapshots directory
	Images          *image.Store
	Driver          string // the driver's name, which a snapshot records
	// ImageNotFound is the runtime's error for an image missing from the
	// store.
	ImageNotFound error
	// Record records a box of img, its directory prepared by prepare (a
	// restore's or an import's writable layer), with the options its
	// sequence decided (Restore's check, Import's limits).
	Record func(ctx context.Context, img *image.Image, prepare func(context.Context, vmm.Spec) error) (B, error)
	// Remove removes a box a sequence made and then gave up on; why is
	// the reason a box.removed event says.
	Remove func(ctx context.Context, b B, why string)
	// RemoveSnapshot removes snapshot name.
	RemoveSnapshot func(ctx context.Context, name string) error
}

// Restore makes a box of snapshot name with sn and starts it from the
// snapshot's memory: check decides the box's options from the
// snapshot's record (the runtime's), Record records it, start starts its
// machine with the func it is given and tells the guest it was restored.
// A box whose start fails is removed (why: failed).
func (mk Maker[B]) Restore(ctx context.Context, sn vmm.Snapshotter, name, failed string, check func(snapmeta.Meta) error,
	start func(ctx context.Context, b B, machine func(context.Context, vmm.Spec) (vmm.Machine, error)) error) (B, error) {
	var zero B
	m, err := snapmeta.Read(mk.Snapshots, name)
	if err != nil {
		return zero, err
	}
	lk, err := snapmeta.Lock(ctx, mk.Snapshots, name, true)
	if err != nil {
		return zero, err
	}
	defer lk.Unlock()
	if m.Driver != mk.Driver {
		return zero, fmt.Errorf("snapshot %s was taken by VM driver %s, not %s", name, m.Driver, mk.Driver)
	}
	if err := check(m); err != nil {
		return zero, err
	}
	img, err := mk.Images.Resolve(m.ImageDigest)
	if err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return zero, fmt.Errorf("snapshot %s: its image %s (%s) is no longer in the image store: pull that image again, or take a new snapshot: %w",
				name, m.Image, m.ImageDigest, mk.ImageNotFound)
		}
		return zero, fmt.Errorf("snapshot %s: image %s: %w", name, m.Image, err)
	}
	dir := filepath.Join(mk.Snapshots, name)
	b, err := mk.Record(ctx, img, func(ctx context.Context, spec vmm.Spec) error {
		return sn.CreateFromSnapshot(ctx, spec, dir)
	})
	if err != nil {
		return zero, fmt.Errorf("restore snapshot %s: %w", name, err)
	}
	if err := start(ctx, b, func(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
		return sn.StartFromSnapshot(ctx, spec, dir)
	}); err != nil {
		mk.Remove(context.WithoutCancel(ctx), b, failed)
		return zero, fmt.Errorf("restore snapshot %s: %w", name, err)
	}
	return b, nil
}

// ArchiveError is Import's error for an archive that boxarchive.Read
// refused (not an archive this airlock reads, one past its bounds, or one
// whose manifest limits refused); its text is Err's.
type ArchiveError struct{ Err error }

func (e *ArchiveError) Error() string { return e.Err.Error() }
func (e *ArchiveError) Unwrap() error { return e.Err }

// Import makes a box of the archive read from rd (boxarchive.Read, its
// entries held to what limits decides of its manifest: the runtime's
// checks of the box configuration it carries). Without memory the box
// is recorded (Record) with the archive's writable layer and
// checkpoints, stopped. With memory the archive is stored as snapshot
// (default: boxarchive.SnapshotName), config being the configuration
// its record gets, and restore makes the box of it; a snapshot that
// restore cannot use is removed. snapshot is "" without memory.
func (mk Maker[B]) Import(ctx context.Context, rd io.Reader, snapshot string, limits func(m *boxarchive.Manifest) (boxarchive.Limits, error),
	config func(img *image.Image) []byte, restore func(ctx context.Context, snapshot string) (B, error)) (b B, _ string, err error) {
	ar, err := boxarchive.Read(rd, limits)
	if err != nil {
		return b, "", &ArchiveError{Err: err}
	}
	m := ar.Manifest()
	if err := boxarchive.CheckFreeSpace(mk.Home, m); err != nil {
		return b, "", err
	}
	img, err := mk.Images.Resolve(m.ImageDigest)
	if err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return b, "", fmt.Errorf("the archive's image %s (%s) is not in the image store: pull or import that image first: %w", m.Image, m.ImageDigest, mk.ImageNotFound)
		}
		return b, "", err
	}
	if img.Digest != m.ImageDigest {
		return b, "", fmt.Errorf("the archive's image %s resolved to %s here: %w", m.ImageDigest, img.Digest, mk.ImageNotFound)
	}
	if m.Kind == boxarchive.KindBox {
		// The disk is read and checked before the box is recorded: an
		// import that fails, or is killed, midway leaves no half box.
		disk, cleanup, err := ar.ExtractDisk(ctx, filepath.Join(mk.Home, "tmp"))
		if err != nil {
			return b, "", fmt.Errorf("import box: %w", err)
		}
		defer cleanup()
		b, err = mk.Record(ctx, img, func(ctx context.Context, spec vmm.Spec) error {
			dst := filepath.Join(spec.Dir, boxdir.RW)
			if err := os.Rename(disk, dst); err != nil {
				if err := rootfs.CopyDisk(disk, dst); err != nil { // another filesystem
					return err
				}
			}
			return boxarchive.AdoptCheckpoints(spec.Dir, filepath.Dir(disk), m)
		})
		if err != nil {
			return b, "", fmt.Errorf("import box: %w", err)
		}
		return b, "", nil
	}
	// An archive with memory: a snapshot first.
	if snapshot == "" {
		snapshot = boxarchive.SnapshotName(m, snapmeta.ValidName)
	}
	if err := snapmeta.CheckName(snapshot); err != nil {
		return b, "", err
	}
	if err := ar.ImportSnapshot(ctx, mk.Snapshots, snapshot, config(img)); err != nil {
		return b, "", err
	}
	if b, err = restore(ctx, snapshot); err != nil {
		// A snapshot this host cannot restore is of no use here.
		mk.RemoveSnapshot(context.WithoutCancel(ctx), snapshot)
		return b, "", err
	}
	return b, snapshot, nil
}

// Fork makes n boxes at once with create (a fork's children, restored
// from one snapshot); when any fails, those made are removed (why:
// failed) and the errors are returned joined.
func (mk Maker[B]) Fork(ctx context.Context, n int, failed string, create func(context.Context) (B, error)) ([]B, error) {
	kids := make([]B, n)
	errs := make([]error, n)
	ok := make([]bool, n)
	var wg sync.WaitGroup
	for i := range kids {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			kids[i], errs[i] = create(ctx)
			ok[i] = errs[i] == nil
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, k := range kids {
			if ok[i] {
				mk.Remove(context.WithoutCancel(ctx), k, failed)
			}
		}
		return nil, err
	}
	return kids, nil
}

// ExportSnapshot writes snapshot name as an archive with memory to w
// (boxarchive.Write), calling it label in the archive; seal, when set,
// first records the digests of the boot files' content, so that another
// host with the same files (the same image, agent and kernel) can
// restore it.
func (mk Maker[B]) ExportSnapshot(ctx context.Context, name, label string, w io.Writer, seal func(ctx context.Context, dir string) error) (boxarchive.Stats, error) {
	sm, err := snapmeta.Read(mk.Snapshots, name)
	if err != nil {
		return boxarchive.Stats{}, err
	}
	lk, err := snapmeta.Lock(ctx, mk.Snapshots, name, true)
	if err != nil {
		return boxarchive.Stats{}, err
	}
	defer lk.Unlock()
	dir := filepath.Join(mk.Snapshots, name)
	if seal != nil {
		if err := seal(ctx, dir); err != nil {
			return boxarchive.Stats{}, fmt.Errorf("export snapshot %s: %w", name, err)
		}
	}
	m := boxarchive.Manifest{Kind: boxarchive.KindSnapshot, Box: sm.Box, BoxName: sm.BoxName, Snapshot: label,
		Image: sm.Image, ImageDigest: sm.ImageDigest, Config: sm.Config, Exported: time.Now().UTC()}
	st, err := boxarchive.Write(ctx, w, m, filepath.Join(dir, boxarchive.DiskFile), dir, nil)
	if err != nil {
		return st, fmt.Errorf("export snapshot %s: %w", name, err)
	}
	return st, nil
}
