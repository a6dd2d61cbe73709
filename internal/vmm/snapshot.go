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
	// returns the bytes written. opts say what the snapshot is for.
	SaveSnapshot(ctx context.Context, spec Spec, h Handle, dir string, opts SaveOptions) (SnapshotStats, error)
	// CheckSnapshot says whether the snapshot in dir can be restored for
	// spec by this driver: an error names what changed or is gone (the
	// kernel, the agent, QEMU, the machine layout).
	CheckSnapshot(spec Spec, dir string) error
	// CreateFromSnapshot prepares a new box directory (spec.Dir exists)
	// from the snapshot in dir: its own copy of the writable layer, at
	// spec.Disks.Layer.
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

// MachineFileChecker is a Snapshotter whose snapshots can come from
// another host (a memory archive): CheckMachineFile checks the machine
// description such a snapshot carries (its machine.json, b its bytes)
// before it is stored, where what reaches the machine unchecked at a
// restore (QEMU: the kernel command line) must be what the driver writes.
// The restore checks the rest against this host. A driver without it
// cannot import memory archives.
type MachineFileChecker interface {
	CheckMachineFile(b []byte) error
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

// SaveOptions tune SaveSnapshot. The zero value takes a snapshot that any
// process can restore any time, with its own copy of the writable layer.
type SaveOptions struct {
	// LinkDisk: the machine does not run again before it is started from
	// the snapshot (a box suspended to disk), so the driver may make the
	// snapshot's writable layer a hard link to the box's own, which
	// nothing changes meanwhile, rather than a copy of it.
	LinkDisk bool
	// Transient: only this process starts machines from the snapshot, at
	// once, and removes it afterwards (Fork's). The driver may then keep
	// the snapshot's memory in this process's memory for those starts
	// instead of writing it to the directory, and skip making the
	// snapshot durable (no fsync). Such a snapshot cannot be started from
	// by another process, or once the driver let go of its memory
	// (StartFromSnapshot then fails saying so).
	Transient bool
	// Chain: the snapshot is a checkpoint (Box.Checkpoint): the driver
	// keeps what lets a later one store only what changed since (per-page
	// hashes of its memory and writable layer).
	Chain bool
	// Parent, with Chain: the directory of an earlier snapshot saved with
	// Chain, a sibling of the new one's final directory (the box's
	// previous checkpoint). The driver may then store only what differs
	// from it; such a snapshot needs its parents to be restored until
	// pagediff.Merge folds a removed parent into it. A parent it cannot
	// use (gone, another machine) makes a whole snapshot.
	Parent string
}
