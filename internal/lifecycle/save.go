package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-run/airlock/internal/boxarchive"
	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/boxvm"
	"github.com/airlock-run/airlock/internal/checkpoint"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/scratch"
	"github.com/airlock-run/airlock/internal/snapmeta"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Paused reports whether the machine of rec is paused (vmm.Pauser): its
// vCPUs are stopped, so its agent answers no new connection's handshake.
// False when the driver cannot tell.
func (b *Box) Paused(ctx context.Context, rec *store.Box) bool {
	paused, err := b.PausedState(ctx, rec)
	return err == nil && paused
}

// PausedState asks the driver whether the machine of rec is paused; an
// error says it could not tell (no machine, no answer, a driver that
// cannot pause).
func (b *Box) PausedState(ctx context.Context, rec *store.Box) (bool, error) {
	p, ok := b.Drv.(vmm.Pauser)
	if !ok || rec == nil || !boxvm.Running(rec) {
		return false, errors.New("no running machine that can pause")
	}
	return p.Paused(ctx, b.Host.Spec(rec), boxvm.Handle(rec))
}

// Continue lets the machine of rec run again if it is paused, so that a
// stop shuts it down cleanly: a paused guest cannot answer the shutdown
// request, and a stop waited out its whole grace and then made the
// machine quit, its processes never told and its files not flushed.
func (b *Box) Continue(ctx context.Context, rec *store.Box) {
	if !b.Paused(ctx, rec) {
		return
	}
	if p, ok := b.Drv.(vmm.Pauser); ok {
		p.Resume(ctx, b.Host.Spec(rec), boxvm.Handle(rec))
	}
}

// Suspend pauses the running machine of rec (its lock held; spec its
// machine with its disks), saves its state in the box directory
// (boxdir.SaveSuspended; the writable layer linked, not copied: the
// machine does not run again) and then ends it with stop, without a
// shutdown. A failed save lets a machine that was not paused before run
// on; a failed stop drops the saved state.
func (b *Box) Suspend(ctx context.Context, rec *store.Box, spec vmm.Spec, sn vmm.Snapshotter, p vmm.Pauser, stop func() error) error {
	h := boxvm.Handle(rec)
	// Stopped first, the machine stays stopped after the save: nothing
	// the guest does after the saved instant reaches its disk.
	was, err := p.Paused(ctx, spec, h)
	if err != nil {
		return fmt.Errorf("suspend box %s: %w", b.ID, err)
	}
	b.VM.WaitExecTails(ctx) // the flush's
	if err := p.Pause(ctx, spec, h); err != nil {
		return fmt.Errorf("suspend box %s: %w", b.ID, err)
	}
	final, err := boxdir.SaveSuspended(b.Dir, func(tmp string) error {
		_, err := sn.SaveSnapshot(ctx, spec, h, tmp, vmm.SaveOptions{LinkDisk: true})
		return err
	})
	if err != nil {
		if !was {
			p.Resume(context.WithoutCancel(ctx), spec, h)
		}
		return fmt.Errorf("suspend box %s: %w", b.ID, err)
	}
	// Ended without a shutdown: the guest must not run on.
	if err := stop(); err != nil {
		boxdir.DropSuspended(final)
		return err
	}
	return nil
}

// StableDisk returns a path to the box's writable layer that nothing
// writes while the caller reads it: the disk itself for a stopped box
// (held by the box lock until cleanup), else a copy in dir made while the
// box was paused, after flush (a sync in the guest). load reads the
// box's record, with its lock held.
func (b *Box) StableDisk(ctx context.Context, dir string, load func(context.Context) (*store.Box, error), flush func(context.Context) error) (disk string, paused time.Duration, cleanup func(), err error) {
	unlock, err := b.Lock(ctx)
	if err != nil {
		return "", 0, nil, err
	}
	rec, err := load(ctx)
	if err != nil {
		unlock()
		return "", 0, nil, err
	}
	rw := filepath.Join(b.Dir, boxdir.RW)
	if !boxvm.Running(rec) {
		if _, err := os.Stat(rw); err != nil {
			unlock()
			return "", 0, nil, fmt.Errorf("box %s has no writable layer: %w", b.ID, err)
		}
		return rw, 0, unlock, nil
	}
	defer unlock()
	p, ok := b.Drv.(vmm.Pauser)
	if !ok {
		return "", 0, nil, fmt.Errorf("read the disk of running box %s: %w (driver %s): stop the box first", b.ID, vmm.ErrNotSupported, b.Drv.Name())
	}
	// Dirty pages in the guest's page cache are not on the disk yet.
	if err := flush(ctx); err != nil {
		return "", 0, nil, fmt.Errorf("box %s: flush its filesystem (sync): %w; stop the box and try again", b.ID, err)
	}
	copyPath := scratch.Path(dir, "disk-"+b.ID, ".ext4")
	paused, err = vmm.WhilePaused(ctx, p, b.Host.Spec(rec), boxvm.Handle(rec), func() error { return rootfs.CopyDisk(rw, copyPath) })
	if err != nil {
		os.Remove(copyPath)
		return "", 0, nil, fmt.Errorf("copy the writable layer of box %s: %w", b.ID, err)
	}
	return copyPath, paused, func() { os.Remove(copyPath) }, nil
}

// Save saves the running machine of rec (its lock held; spec its machine
// with its disks) into dir with the driver's SaveSnapshot. First it waits
// (up to boxvm.ExecTailWait) until the agent has finished with the execs
// of this process's connection that have returned: it cleans up after an
// exec (its cgroup) once the caller has the exit status, and a memory
// snapshot taken meanwhile would carry that work into every box restored
// from it. Then it stops the box's processes (the agent's Freeze) for the
// time of the save, so that boxes restored from it run none of them before
// their RNG is reseeded (until then they share the snapshot's RNG state),
// and continues them in this box after (boxvm.Session.Freeze); touch
// records that as a use. A paused box's agent cannot answer: its
// snapshot is taken as it is.
func (b *Box) Save(ctx context.Context, rec *store.Box, spec vmm.Spec, sn vmm.Snapshotter, dir string, opts vmm.SaveOptions, touch func()) (vmm.SnapshotStats, error) {
	b.VM.WaitExecTails(ctx)
	if !b.Paused(ctx, rec) {
		touch()
		thaw, err := b.VM.Freeze(ctx)
		if err != nil {
			return vmm.SnapshotStats{}, err
		}
		defer thaw()
	}
	return sn.SaveSnapshot(ctx, spec, boxvm.Handle(rec), dir, opts)
}

// Export writes the box, of record rec and stored configuration config,
// as an archive without memory to w (boxarchive.Write): its writable
// layer, stable while it is read (StableDisk: load and flush as there),
// and, with ckpts, its checkpoints, each whole, parents first, sealed
// with seal when set (boxarchive.WholeCheckpoints, under the box's lock:
// none taken or removed meanwhile). tmp is the home's scratch directory.
// paused is how long a running box was paused for its disk's copy.
func (b *Box) Export(ctx context.Context, w io.Writer, tmp string, rec *store.Box, config []byte, ckpts bool, seal func(context.Context, string) error,
	load func(context.Context) (*store.Box, error), flush func(context.Context) error) (st boxarchive.Stats, paused time.Duration, err error) {
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return st, 0, err
	}
	var cs []boxarchive.CheckpointSource
	var head string
	if ckpts {
		unlock, err := b.Lock(ctx)
		if err != nil {
			return st, 0, err
		}
		var drop func()
		cs, head, drop, err = boxarchive.WholeCheckpoints(ctx, checkpoint.Of(b.Dir), tmp, seal)
		unlock()
		if err != nil {
			return st, 0, fmt.Errorf("export box %s: %w", b.ID, err)
		}
		defer drop()
	}
	disk, paused, cleanup, err := b.StableDisk(ctx, tmp, load, flush)
	if err != nil {
		return st, 0, err
	}
	defer cleanup()
	m := boxarchive.Manifest{Kind: boxarchive.KindBox, Box: b.ID, BoxName: rec.Name, Image: rec.Image,
		ImageDigest: rec.ImageDigest, Config: config, Exported: time.Now().UTC(), CheckpointHead: head}
	if st, err = boxarchive.Write(ctx, w, m, disk, "", cs); err != nil {
		return st, paused, fmt.Errorf("export box %s: %w", b.ID, err)
	}
	return st, paused, nil
}

// Rollback puts the box (its lock held) back to its checkpoint name of
// t, with sn: the rollback is recorded first (execs that the stop ends
// say why: checkpoint.Ended), then stop stops it (the runtime's: it
// records and tells), a suspended box's saved state is dropped, the
// checkpoint's writable layer takes the place of the box's (spec names
// it) and start starts the box with the machine func it is given (a
// restore of the checkpoint).
func (b *Box) Rollback(ctx context.Context, sn vmm.Snapshotter, t checkpoint.Tree, name string, stop func() error, spec func() (vmm.Spec, error),
	start func(machine func(context.Context, vmm.Spec) (vmm.Machine, error)) error) error {
	if err := t.RolledBack(name, time.Now()); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return err
	}
	if s := boxdir.SuspendedIn(b.Dir); s != "" {
		boxdir.DropSuspended(s) // replaced by the checkpoint
	}
	sp, err := spec()
	if err != nil {
		return err
	}
	dir := t.Path(name)
	if err := checkpoint.SwapLayer(sp.Disks.Layer, func() error { return sn.CreateFromSnapshot(ctx, sp, dir) }); err != nil {
		return err
	}
	return start(func(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
		return sn.StartFromSnapshot(ctx, spec, dir)
	})
}

// CheckpointSnapshot makes snapshot name under snapshots of the box's
// checkpoint ckpt, whole (checkpoint.Tree.Flatten), recorded as the box
// of rec and stored configuration config (agent: the guest agent's
// version for a checkpoint that does not record one). The caller holds
// the box's lock: the checkpoint is not removed meanwhile.
func (b *Box) CheckpointSnapshot(ctx context.Context, snapshots, name, ckpt string, rec *store.Box, config []byte, agent string) error {
	t := checkpoint.Of(b.Dir)
	cm, err := t.Get(ckpt)
	if err != nil {
		return err
	}
	if cm.AgentVersion != "" {
		agent = cm.AgentVersion
	}
	return snapmeta.Make(ctx, snapshots, name, "snapshot-", "remove it, or pick another name", nil, func(tmp string) (snapmeta.Meta, error) {
		if err := t.Flatten(ckpt, tmp); err != nil {
			return snapmeta.Meta{}, fmt.Errorf("checkpoint %s of box %s: %w", ckpt, b.ID, err)
		}
		return snapmeta.Meta{Version: snapmeta.Version, Name: name, Box: b.ID, BoxName: rec.Name, Created: cm.Created,
			Image: rec.Image, ImageDigest: rec.ImageDigest, Config: config, AgentVersion: agent,
			Driver: b.Drv.Name(), StateBytes: cm.StateBytes, DiskBytes: cm.DiskBytes, PausedNs: cm.PausedNs}, nil
	})
}
