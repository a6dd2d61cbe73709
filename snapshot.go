package airlock

import (
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/lifecycle"
	"github.com/airlock-run/airlock/internal/snapmeta"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Snapshot errors; test them with errors.Is.
var (
	// ErrSnapshotNotFound: no snapshot has that name.
	ErrSnapshotNotFound = snapmeta.ErrNotFound
	// ErrSnapshotExists: a snapshot of that name already exists.
	ErrSnapshotExists = snapmeta.ErrExists
)

// SnapshotInfo describes a memory snapshot of a box (Box.Snapshot).
type SnapshotInfo struct {
	Name    string
	Box     string // id of the box it was taken of
	BoxName string // that box's name, "" if unnamed
	Created time.Time
	// Image and ImageDigest are the box's image; a restore needs that
	// digest in the image store.
	Image, ImageDigest string
	// Options are the box's options: a restored box has its CPUs, memory,
	// disk size and network, and by default its Env, WorkingDir and User.
	Options BoxOptions
	// AgentVersion is the guest agent's protocol version in the snapshot.
	AgentVersion string
	// Driver is the VM driver that took it ("qemu").
	Driver string
	// StateBytes is the size on disk of the memory and device state,
	// DiskBytes that of the writable layer's copy (bytes allocated).
	StateBytes, DiskBytes int64
	// Paused is how long the box was stopped while the snapshot was taken.
	Paused time.Duration
	// Dir is where the snapshot is stored (Home/snapshots/NAME).
	Dir string
}

func (r *Runtime) snapshotsDir() string { return filepath.Join(r.opts.Home, "snapshots") }

func (r *Runtime) snapshotter() (vmm.Snapshotter, error) {
	s, ok := r.drv.(vmm.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("snapshots: %w (driver %s)", vmm.ErrNotSupported, r.drv.Name())
	}
	return s, nil
}

// Snapshot saves the running box's memory, device state and writable
// layer as snapshot name under Home/snapshots: the box is paused while its
// state is written and its disk copied, then runs on. Boxes restored from it (Create with
// BoxOptions.FromSnapshot) start where it was, with its running processes.
// Errors: ErrBoxNotRunning, ErrSnapshotExists, ErrNotSupported for a
// driver without snapshots.
func (b *Box) Snapshot(ctx context.Context, name string) (SnapshotInfo, error) {
	info, err := b.snapshotWith(ctx, name, vmm.SaveOptions{})
	if err == nil {
		b.emit(Event{Type: EventBoxSnapshotted, Snapshot: info.Name})
	}
	return info, err
}

// snapshotWith is Snapshot with the driver's save options (Fork's
// snapshot is transient).
func (b *Box) snapshotWith(ctx context.Context, name string, opts vmm.SaveOptions) (SnapshotInfo, error) {
	if err := snapmeta.CheckName(name); err != nil {
		return SnapshotInfo{}, err
	}
	var m snapmeta.Meta
	err := b.withSave(ctx, "snapshot", "snapshotted or forked", opts, func(rec *store.Box, save func(string) (vmm.SnapshotStats, error)) error {
		agentVersion, err := b.snapshotAgentVersion(ctx, rec)
		if err != nil {
			return err
		}
		return snapmeta.Make(ctx, b.r.snapshotsDir(), name, "snapshot-", "remove it, or pick another name", nil, func(tmp string) (snapmeta.Meta, error) {
			_, cfg := b.snapshot()
			st, err := save(tmp)
			if err != nil {
				return m, fmt.Errorf("snapshot box %s: %w", b.id, err)
			}
			m = snapmeta.Meta{Version: snapmeta.Version, Name: name, Box: b.id, BoxName: rec.Name, Created: time.Now().UTC(),
				Image: rec.Image, ImageDigest: rec.ImageDigest, Config: encodeConfig(cfg), AgentVersion: agentVersion,
				Driver: b.r.drv.Name(), StateBytes: st.StateBytes, DiskBytes: st.DiskBytes, PausedNs: st.PausedNs}
			return m, nil
		})
	})
	if err != nil {
		return SnapshotInfo{}, err
	}
	return b.r.snapshotInfo(m)
}

// withSave calls f under the box's lock, the box running and without
// volumes (QEMU cannot migrate a mounted 9p share; a volume's disk would be
// shared by every restored box), with save: the driver's SaveSnapshot into
// a directory, the box's processes frozen. verb and done name it in errors.
func (b *Box) withSave(ctx context.Context, verb, done string, opts vmm.SaveOptions, f func(rec *store.Box, save func(dir string) (vmm.SnapshotStats, error)) error) error {
	sn, err := b.r.snapshotter()
	if err != nil {
		return err
	}
	if _, cfg := b.snapshot(); len(cfg.Options.Volumes) > 0 {
		return fmt.Errorf("box %s has volumes: boxes with volumes cannot be %s (detach them: create the box without -v)", b.id, done)
	}
	rec, unlock, err := b.lockLoad(ctx)
	defer unlock()
	if err != nil {
		return err
	}
	if !running(rec) {
		return fmt.Errorf("%w: %s: start it to %s it", ErrBoxNotRunning, b.id, verb)
	}
	spec, err := b.specWithDisks(ctx, rec)
	if err != nil {
		return err
	}
	return f(rec, func(dir string) (vmm.SnapshotStats, error) {
		// The box's processes frozen (lifecycle.Box.Save).
		return b.eng.Save(ctx, rec, spec, sn, dir, opts, func() { b.touch(ctx) })
	})
}

func (r *Runtime) snapshotInfo(m snapmeta.Meta) (SnapshotInfo, error) {
	cfg, err := configOf(m.Config)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: its box configuration: %w", m.Name, err)
	}
	return SnapshotInfo{Name: m.Name, Box: m.Box, BoxName: m.BoxName, Created: m.Created, Image: m.Image,
		ImageDigest: m.ImageDigest, Options: cfg.Options, AgentVersion: m.AgentVersion, Driver: m.Driver,
		StateBytes: m.StateBytes, DiskBytes: m.DiskBytes, Paused: time.Duration(m.PausedNs),
		Dir: filepath.Join(r.snapshotsDir(), m.Name)}, nil
}

func (r *Runtime) readSnapshot(name string) (snapmeta.Meta, error) {
	return snapmeta.Read(r.snapshotsDir(), name)
}

// Snapshot returns the snapshot named name. Errors: ErrSnapshotNotFound.
func (r *Runtime) Snapshot(ctx context.Context, name string) (SnapshotInfo, error) {
	m, err := r.readSnapshot(name)
	if err != nil {
		return SnapshotInfo{}, err
	}
	return r.snapshotInfo(m)
}

// Snapshots returns every snapshot of this home, oldest first. Snapshots
// that cannot be read are left out.
func (r *Runtime) Snapshots(ctx context.Context) ([]SnapshotInfo, error) {
	ms, err := snapmeta.ReadAll(r.snapshotsDir())
	if err != nil {
		return nil, err
	}
	var out []SnapshotInfo
	for _, m := range ms {
		if i, err := r.snapshotInfo(m); err == nil {
			out = append(out, i)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// RemoveSnapshot deletes snapshot name. Boxes restored from it are not
// affected: each has its own writable layer, and its memory was loaded
// when it started. A restore in progress from it is waited for.
// Errors: ErrSnapshotNotFound.
func (r *Runtime) RemoveSnapshot(ctx context.Context, name string) error {
	return snapmeta.Remove(ctx, r.snapshotsDir(), name)
}

// restore creates a box from snapshot opts.FromSnapshot and starts it
// from the snapshot's memory (lifecycle.Maker.Restore); then the guest
// gets fresh entropy, the host's time and its own hostname. forPool is
// the key of the warm pool the box is made for ("" for the caller's box).
func (r *Runtime) restore(ctx context.Context, opts BoxOptions, forPool string) (*Box, error) {
	sn, err := r.snapshotter()
	if err != nil {
		return nil, err
	}
	var o BoxOptions
	return r.maker(&o, forPool).Restore(ctx, sn, opts.FromSnapshot, removedStartFailed, func(m snapmeta.Meta) (err error) {
		o, err = r.restoreOptions(m, opts)
		return err
	}, func(ctx context.Context, b *Box, machine func(context.Context, vmm.Spec) (vmm.Machine, error)) error {
		if err := b.startWith(ctx, machine, EventBoxStarted); err != nil {
			return err
		}
		return b.restored(ctx)
	})
}

// maker is the runtime's side of lifecycle's Restore, Import, Fork and
// ExportSnapshot: boxes recorded with *o, which the sequence decides
// (nil: none recorded), for warm pool forPool ("" for the caller's box).
func (r *Runtime) maker(o *BoxOptions, forPool string) lifecycle.Maker[*Box] {
	return lifecycle.Maker[*Box]{Home: r.opts.Home, Snapshots: r.snapshotsDir(), Images: r.images, Driver: r.drv.Name(),
		ImageNotFound: ErrImageNotFound, RemoveSnapshot: r.RemoveSnapshot,
		Record: func(ctx context.Context, img *image.Image, prepare func(context.Context, vmm.Spec) error) (*Box, error) {
			return r.recordBox(ctx, *o, forPool, img, prepare)
		},
		Remove: func(ctx context.Context, b *Box, why string) { b.removeWhy(ctx, true, why) }}
}

// ResolveOptions returns the options a box made by Create with opts gets,
// without making it: the defaults filled in and checked; for a restore
// (opts.FromSnapshot set), the snapshot's machine, image and network with
// the caller's host side (see BoxOptions.FromSnapshot). A server checks
// its policy against them before it creates. Errors: those Create returns
// for the options (ErrInvalidArgument), ErrSnapshotNotFound.
func (r *Runtime) ResolveOptions(ctx context.Context, opts BoxOptions) (BoxOptions, error) {
	if opts.FromSnapshot == "" {
		if err := checkLife(opts); err != nil {
			return BoxOptions{}, err
		}
		return withDefaults(opts)
	}
	m, err := r.readSnapshot(opts.FromSnapshot)
	if err != nil {
		return BoxOptions{}, err
	}
	return r.restoreOptions(m, opts)
}

// restoreOptions is ResolveOptions for a restore from the snapshot m
// describes (boxopts.Restore).
func (r *Runtime) restoreOptions(m snapmeta.Meta, opts BoxOptions) (BoxOptions, error) {
	info, err := r.snapshotInfo(m)
	if err != nil {
		return BoxOptions{}, err
	}
	o, err := boxopts.Restore(opts.FromSnapshot, info.Options.plain(), m.ImageDigest, opts.plain())
	return public(o), err
}

// restored tells the agent of a just restored box to reseed the kernel
// RNG, step the clock to the host's and take the box's hostname.
func (b *Box) restored(ctx context.Context) error {
	c, err := b.client(ctx)
	if err != nil {
		return err
	}
	entropy := make([]byte, 256)
	rand.Read(entropy)
	rec, cfg := b.snapshot()
	if _, err := c.Restored(ctx, entropy, time.Now().UnixNano(), hostname(rec, cfg)); err != nil {
		return fmt.Errorf("box %s: reseed the restored guest: %w", b.id, b.callErr(err))
	}
	return nil
}
