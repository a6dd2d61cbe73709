package boxarchive

import (
	"fmt"
	"path/filepath"

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
