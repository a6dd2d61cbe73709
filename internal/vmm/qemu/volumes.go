package qemu

import (
	"fmt"
	"os"
	"strconv"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/vmm"
)

// checkVolumes refuses volumes this boot cannot attach: a host directory
// that is missing or not a directory, or any host directory when the
// kernel has no 9p (Debian's cloud kernel).
func checkVolumes(vols []vmm.Volume, kernel assets.Kernel) error {
	for _, v := range vols {
		if v.HostDir == "" {
			continue
		}
		fi, err := os.Stat(v.HostDir)
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.HostDir, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("volume %s: not a directory (host volumes share directories)", v.HostDir)
		}
		if kernel.Kind != assets.KernelAirlock {
			return fmt.Errorf("volume %s: host directory volumes need 9p in the guest kernel, which the %s kernel (%s) lacks: use the airlock kernel (hack/build-kernel.sh, or hack/setup.sh)", v.HostDir, kernel.Kind, kernel.Path)
		}
	}
	return nil
}

// volumeDevices returns the disks, 9p shares (see Share) and kernel parameters
// that attach vols; firstDisk is the index the first extra virtio-blk
// disk gets (vda = 0). Host directories are shared over virtio-9p with
// security_model=mapped-xattr (the guest's owners and modes live in
// extended attributes, so a box cannot make a setuid file on the host) and,
// for read-only ones, readonly=on, which QEMU enforces on the host.
func volumeDevices(vols []vmm.Volume, firstDisk int) (disks []Disk, shares []Share, params []string) {
	for i, v := range vols {
		if v.HostDir != "" {
			id := "vol" + strconv.Itoa(i)
			tag := "airlock." + id
			shares = append(shares, Share{ID: id, Tag: tag, HostDir: v.HostDir, ReadOnly: v.ReadOnly})
			params = append(params, guestabi.Volume{Kind: guestabi.VolumeKind9p, Source: tag, Target: v.Target, ReadOnly: v.ReadOnly}.Arg())
			continue
		}
		dev := "vd" + string(rune('a'+firstDisk+len(disks)))
		disks = append(disks, Disk{Path: v.Disk, ReadOnly: v.ReadOnly})
		params = append(params, guestabi.Volume{Kind: guestabi.VolumeKindDisk, Source: dev, Target: v.Target, ReadOnly: v.ReadOnly}.Arg())
	}
	return disks, shares, params
}
