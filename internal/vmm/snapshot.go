package vmm

import "context"

// Snapshotter is a driver that can save a running machine's memory, device
// state and writable layer to a directory, and start machines from such a
// directory: the optional ability behind Box.Snapshot, Box.Fork and
// restores. Drivers without it make those calls fail with ErrNotSupported.
type Snapshotter interface {
	// SaveSnapshot pauses machine h of spec's box, writes its state and a
	// copy of its writable layer (taken while paused, so both agree) into
	// dir (it exists and is empty), and lets the machine run on. It
	// returns the bytes written.
	SaveSnapshot(ctx context.Context, spec Spec, h Handle, dir string) (SnapshotStats, error)
	// CheckSnapshot says whether the snapshot in dir can be restored for
	// spec by this driver: an error names what changed or is gone (the
	// kernel, the agent, QEMU, the machine layout).
	CheckSnapshot(spec Spec, dir string) error
	// CreateFromSnapshot prepares a new box directory (spec.Dir exists)
	// from the snapshot in dir: its own copy of the writable layer.
	CreateFromSnapshot(ctx context.Context, spec Spec, dir string) error
	// StartFromSnapshot starts a machine for spec from the snapshot in
	// dir, running where the snapshot's machine was; like Start it
	// returns once the machine runs. After it, dir may be removed.
	StartFromSnapshot(ctx context.Context, spec Spec, dir string) (Machine, error)
}

// SnapshotSealer is a Snapshotter whose snapshots can be made restorable on
// another host: SealSnapshot records in the snapshot in dir the content of
// what its restore must match (the boot files' digests), where the driver
// otherwise checks only that they are the same local files. Export calls
// it before a snapshot leaves the host.
type SnapshotSealer interface {
	SealSnapshot(ctx context.Context, dir string) error
}

// SnapshotStats describe a saved snapshot.
type SnapshotStats struct {
	StateBytes int64 // the memory and device state file, bytes on disk
	DiskBytes  int64 // the writable layer copy, bytes allocated
	// Paused is how long the machine was stopped (state written and disk
	// copied).
	PausedNs int64
}

// Pauser is a driver whose machines can be paused (no guest CPU runs) and
// resumed in place.
type Pauser interface {
	Pause(ctx context.Context, spec Spec, h Handle) error
	Resume(ctx context.Context, spec Spec, h Handle) error
	// Paused reports whether the machine is paused.
	Paused(ctx context.Context, spec Spec, h Handle) (bool, error)
}

type linkDiskKey struct{}

// WithLinkedDisk marks ctx for a SaveSnapshot whose machine does not run
// again before it is started from dir (a box paused to disk): a driver
// may then make the snapshot's writable layer a hard link to the box's
// own, which nothing changes meanwhile, rather than a copy of it.
func WithLinkedDisk(ctx context.Context) context.Context {
	return context.WithValue(ctx, linkDiskKey{}, true)
}

// LinkedDisk reports whether ctx was marked by WithLinkedDisk.
func LinkedDisk(ctx context.Context) bool {
	v, _ := ctx.Value(linkDiskKey{}).(bool)
	return v
}

type transientKey struct{}

// WithTransientSnapshot marks ctx for a SaveSnapshot whose snapshot only
// this process starts machines from, at once, and removes afterwards
// (Fork's): a driver may then keep the snapshot's memory in this
// process's memory for those starts instead of writing it to dir, and
// skip making the snapshot durable (no fsync). Such a snapshot cannot be
// started from by another process, or once the driver let go of its
// memory (StartFromSnapshot then fails saying so).
func WithTransientSnapshot(ctx context.Context) context.Context {
	return context.WithValue(ctx, transientKey{}, true)
}

// TransientSnapshot reports whether ctx was marked by WithTransientSnapshot.
func TransientSnapshot(ctx context.Context) bool {
	v, _ := ctx.Value(transientKey{}).(bool)
	return v
}
