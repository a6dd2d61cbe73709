package boxarchive

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlock-run/airlock/internal/scratch"
	"github.com/airlock-run/airlock/internal/snapmeta"
	"github.com/airlock-run/airlock/internal/sparse"
	"golang.org/x/sys/unix"
)

// The checks of an archive against the host it is imported on, and the
// sizes of what it wrote: the importer (airlock.ImportBox) decodes the
// box configuration and calls these.

// MaxDiskMiB bounds the disk size of an imported box (the server API's
// bound on DiskSizeMiB): the guest may fill that much of the host's disk.
const MaxDiskMiB = 1 << 20

// BoxLimits are the Limits of an archive whose box has memMiB of memory
// and a disk of diskMiB, with check as Limits.CheckFile; a disk over
// MaxDiskMiB is refused (ErrLimit). The caller holds memMiB to the host's
// memory cap first.
func BoxLimits(memMiB, diskMiB int, check func(name string, content []byte) error) (Limits, error) {
	if diskMiB > MaxDiskMiB {
		return Limits{}, fmt.Errorf("the archive's box has a disk of %d MiB, more than the %d MiB (1 TiB) an imported box may have: %w", diskMiB, MaxDiskMiB, ErrLimit)
	}
	return Limits{DiskBytes: int64(diskMiB) << 20, MemoryBytes: int64(memMiB) << 20, CheckFile: check}, nil
}

// CheckFreeSpace refuses (ErrLimit) an archive whose entries (checked by
// Read) need more space than home's filesystem has free; a snapshot's
// disk is copied once more into the box restored from it. A filesystem
// that cannot be asked passes: the writes will say.
func CheckFreeSpace(home string, m *Manifest) error {
	need := m.DataBytes()
	if m.Kind == KindSnapshot {
		need += m.Files[0].Size
	}
	var st unix.Statfs_t
	if err := unix.Statfs(home, &st); err != nil {
		return nil
	}
	if free := int64(st.Bavail) * int64(st.Bsize); need > free {
		return fmt.Errorf("the archive needs %d MiB and the airlock home %s has %d MiB free: free some space first (or import into another home): %w", need>>20, home, free>>20, ErrLimit)
	}
	return nil
}

// SnapshotName is the name a memory archive m is stored under when the
// importer names none: the archive's snapshot name if valid says it is
// one, else "import-<box id>".
func SnapshotName(m *Manifest, valid func(string) bool) string {
	if m.Snapshot != "" && valid(m.Snapshot) {
		return m.Snapshot
	}
	return "import-" + m.Box
}

// SnapshotBytes are the bytes a snapshot directory that Extract wrote
// takes on disk: its memory and device state, and its disk.
func SnapshotBytes(dir string) (state, disk int64) {
	return sparse.Allocated(filepath.Join(dir, StateFile)) + sparse.Allocated(filepath.Join(dir, RAMFile)),
		sparse.Allocated(filepath.Join(dir, DiskFile))
}

// ExtractDisk extracts a box archive without memory (KindBox) into a new
// directory in tmpRoot (made if missing; scratch.MkdirTemp, swept once
// its maker is gone), so that its disk is read and checked before the
// box is recorded: the disk's path, and what removes the directory.
func (rd *Reader) ExtractDisk(ctx context.Context, tmpRoot string) (disk string, cleanup func(), err error) {
	tmp, err := scratch.MkdirTemp(tmpRoot, "import")
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(tmpRoot, 0o700); err == nil {
			tmp, err = scratch.MkdirTemp(tmpRoot, "import")
		}
	}
	if err != nil {
		return "", nil, err
	}
	if err := rd.Extract(ctx, tmp); err != nil {
		os.RemoveAll(tmp)
		return "", nil, err
	}
	return filepath.Join(tmp, DiskFile), func() { os.RemoveAll(tmp) }, nil
}

// ImportSnapshot stores an archive with memory (KindSnapshot) as snapshot
// name in dir (Home/snapshots; snapmeta.Make, its errors saying "import
// snapshot NAME"). The snapshot's record is rebuilt from what was
// checked, not taken from the archive: the manifest's box and image, the
// sizes of what Extract wrote, the agent version, driver, time and pause
// of its snapshot.json (which Limits.CheckFile had snapmeta.CheckArchived
// check), and config, the box configuration the importer decoded and
// bounded.
func (rd *Reader) ImportSnapshot(ctx context.Context, dir, name string, config []byte) error {
	m := rd.Manifest()
	wrap := func(err error) error { return fmt.Errorf("import snapshot %s: %w", name, err) }
	return snapmeta.Make(ctx, dir, name, "import-", "remove it, or import with another snapshot name", wrap, func(tmp string) (snapmeta.Meta, error) {
		if err := rd.Extract(ctx, tmp); err != nil {
			return snapmeta.Meta{}, err
		}
		sm, err := snapmeta.Load(tmp)
		if err != nil {
			return sm, err
		}
		stateBytes, diskBytes := SnapshotBytes(tmp)
		return snapmeta.Meta{Version: snapmeta.Version, Name: name, Box: m.Box, BoxName: m.BoxName, Created: sm.Created,
			Image: m.Image, ImageDigest: m.ImageDigest, Config: config, AgentVersion: sm.AgentVersion, Driver: sm.Driver,
			StateBytes: stateBytes, DiskBytes: diskBytes, PausedNs: sm.PausedNs}, nil
	})
}

// CheckSnapshotFile is the Limits.CheckFile of an archive with memory:
// its MachineFile is checkMachine's to check (the VM driver's: QEMU's
// kernel command line reaches -append); its SnapshotFile, whose agent
// version and driver the imported snapshot's record keeps, is
// snapmeta.CheckArchived's.
func CheckSnapshotFile(checkMachine func(content []byte) error) func(name string, content []byte) error {
	return func(name string, b []byte) error {
		switch name {
		case MachineFile:
			return checkMachine(b)
		case snapmeta.File:
			return snapmeta.CheckArchived(b)
		}
		return nil
	}
}
