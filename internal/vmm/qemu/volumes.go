package qemu

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Volume transports for host directories (Options.VolumeTransport).
const (
	// Transport9p shares host directories over virtio-9p, served by QEMU
	// itself (the default).
	Transport9p = "9p"
	// TransportVirtioFS shares host directories over virtio-fs, each
	// served by its own virtiofsd (see virtiofsd.go).
	TransportVirtioFS = "virtiofs"
)

// CheckTransport returns the transport t names ("" is Transport9p) or an
// error saying which ones exist.
func CheckTransport(t string) (string, error) {
	switch t {
	case "", Transport9p:
		return Transport9p, nil
	case TransportVirtioFS, "virtio-fs":
		return TransportVirtioFS, nil
	}
	return "", fmt.Errorf("volume transport %q (Options.VolumeTransport, or AIRLOCK_VOLUME_TRANSPORT): want 9p or virtiofs", t)
}

// checkVolumes refuses volumes this boot cannot attach: a host directory
// that is missing or not a directory, or any host directory when the
// kernel lacks the transport (Debian's cloud kernel has no 9p; kernels
// built before virtio-fs was added have no virtio-fs), or, for virtio-fs,
// when virtiofsd cannot run.
func checkVolumes(vols []vmm.Volume, kernel assets.Kernel, transport string) error {
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
			return fmt.Errorf("volume %s: host directory volumes need 9p or virtio-fs in the guest kernel, which the %s kernel (%s) lacks: use the airlock kernel (hack/build-kernel.sh, or hack/setup.sh)", v.HostDir, kernel.Kind, kernel.Path)
		}
		if transport == TransportVirtioFS {
			if !kernel.VirtioFS {
				return fmt.Errorf("volume %s: the guest kernel %s has no virtio-fs (CONFIG_VIRTIO_FS; built from an older hack/kernel/airlock-guest.config): rebuild it with hack/build-kernel.sh, or use the 9p volume transport", v.HostDir, kernel.Path)
			}
			if strings.Contains(v.HostDir, ",") {
				return fmt.Errorf("volume %s: virtiofsd cannot share a path with a comma in it: use the 9p volume transport", v.HostDir)
			}
		}
	}
	return nil
}

// volumeDevices returns the disks, 9p shares (see Share), virtio-fs shares
// (see FSShare) and kernel parameters that attach spec's volumes over
// transport; firstDisk is the index the first extra virtio-blk disk gets
// (vda = 0).
//
// Over 9p, host directories are shared with security_model=mapped-xattr
// (the guest's owners and modes live in extended attributes, so a box
// cannot make a setuid file on the host) and, for read-only ones,
// readonly=on, which QEMU enforces on the host. What the guest creates
// gets the host modes of the host's umask (HostModes: 0644 and 0755 under
// 022), and, from a confined QEMU, the directory's owner (its idmapped
// mount, see confine.Start).
//
// Over virtio-fs, each host directory gets a vhost-user-fs device whose
// backend is a virtiofsd listening on a socket in the box's socket
// directory (started by startShares before QEMU); guest RAM is then one
// shared memfd the daemon can map (sharedRAMArgs, Config.args adds it).
func volumeDevices(spec vmm.Spec, transport string, firstDisk int) (disks []Disk, shares []Share, fs []FSShare, params []string) {
	for i, v := range spec.Volumes {
		id := "vol" + strconv.Itoa(i)
		tag := "airlock." + id
		if v.HostDir != "" && transport == TransportVirtioFS {
			fs = append(fs, FSShare{ID: id, Tag: tag, Socket: newShare(spec, i, v).sock})
			params = append(params, guestabi.Volume{Kind: guestabi.VolumeKindVirtioFS, Source: tag, Target: v.Target, ReadOnly: v.ReadOnly}.Arg())
			continue
		}
		if v.HostDir != "" {
			fm, dm := HostModes()
			shares = append(shares, Share{ID: id, Tag: tag, HostDir: v.HostDir, ReadOnly: v.ReadOnly, FileMode: fm, DirMode: dm})
			params = append(params, guestabi.Volume{Kind: guestabi.VolumeKind9p, Source: tag, Target: v.Target, ReadOnly: v.ReadOnly}.Arg())
			continue
		}
		dev := "vd" + string(rune('a'+firstDisk+len(disks)))
		disks = append(disks, Disk{Path: v.Disk, ReadOnly: v.ReadOnly})
		params = append(params, guestabi.Volume{Kind: guestabi.VolumeKindDisk, Source: dev, Target: v.Target, ReadOnly: v.ReadOnly}.Arg())
	}
	return disks, shares, fs, params
}

// sharedRAMArgs makes all of guest RAM (memMiB) one shared memfd, which a
// vhost-user backend (virtiofsd) maps to reach the guest's buffers (QEMU
// passes it the memfd over the socket), and the virtio-mmio devices
// modern. It replaces THPCode's split RAM layout (whose huge-page parts are
// private anonymous memory that no other process can map).
func sharedRAMArgs(memMiB int) []string {
	if memMiB <= 0 {
		memMiB = 512
	}
	return []string{"-object", fmt.Sprintf("memory-backend-memfd,id=airlock-ram,size=%dM,share=on", memMiB),
		"-machine", "memory-backend=airlock-ram",
		// microvm's virtio-mmio devices are legacy (version 1) by default,
		// which libvhost-user refuses ("virtio legacy devices aren't
		// supported"): modern ones (version 2), which Linux drives too.
		"-global", "virtio-mmio.force-legacy=false"}
}

// specShares returns the virtio-fs shares (their daemons) of spec's
// volumes over transport.
func specShares(spec vmm.Spec, transport string) []share {
	if transport != TransportVirtioFS {
		return nil
	}
	var out []share
	for i, v := range spec.Volumes {
		if v.HostDir != "" {
			out = append(out, newShare(spec, i, v))
		}
	}
	return out
}

// shareSocks returns the socket names (in the box's socket directory) of
// the virtio-fs shares spec's volumes get over transport.
func shareSocks(spec vmm.Spec, transport string) []string {
	var out []string
	if transport != TransportVirtioFS {
		return nil
	}
	for i, v := range spec.Volumes {
		if v.HostDir != "" {
			out = append(out, shareSock(i))
		}
	}
	return out
}
