package airlock

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/volume"
)

// Volume attaches storage to a box at Target (BoxOptions.Volumes).
//
// A Source that is an absolute host path shares that directory with the
// box over 9p (virtio-9p): changes on either side are seen at once by the
// other. ReadOnly is enforced by QEMU on the host (readonly=on), so not even
// root in the box can write, with `mount -o remount,rw` or otherwise. The
// box cannot reach host files outside the directory: QEMU resolves every
// path component itself without following symlinks (a symlink in the share
// is followed by the guest, inside the guest). Files the box creates belong
// to the user running QEMU; their owners and modes as the box sees them are
// kept in extended attributes (security_model=mapped-xattr), so a box cannot
// create a setuid file on the host. Host directory volumes need the airlock
// guest kernel (Debian's cloud kernel has no 9p).
//
// With Options.VolumeTransport "virtiofs" host directories are shared over
// virtio-fs instead: one virtiofsd per directory, started with the box and
// ending with it, sandboxed in the directory (its own mount, pid and net
// namespaces, seccomp); ReadOnly is a read-only bind mount on the host, so
// writes fail with EROFS there too. Owners and modes pass through: files
// the box creates get the box's uid, gid and mode on the host (see
// docs/files.md for when to choose which).
//
// Any other Source names a named volume (see Runtime.CreateVolume; one is
// created with DefaultVolumeSizeMiB when missing): an ext4 image attached as
// a virtio-blk disk, kept when boxes are removed, with its size as a hard
// limit (ENOSPC in the box). A named volume can be attached to one running
// box at a time.
type Volume struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// IsHostDir reports whether the volume shares a host directory.
func (v Volume) IsHostDir() bool { return filepath.IsAbs(v.Source) }

// DefaultVolumeSizeMiB is the size of a named volume created without one.
const DefaultVolumeSizeMiB = volume.DefaultSizeMiB

// ParseVolume parses Docker's -v syntax: SOURCE:TARGET[:ro|:rw], where
// SOURCE is a host directory (absolute, or starting with "." for one
// relative to the working directory) or a volume name.
func ParseVolume(spec string) (Volume, error) {
	m, err := volume.Parse(spec)
	return Volume(m), err
}

// mounts are vs as internal/volume takes them.
func mounts(vs []Volume) []volume.Mount {
	ms := make([]volume.Mount, len(vs))
	for i, v := range vs {
		ms[i] = volume.Mount(v)
	}
	return ms
}

// VolumeInfo describes a named volume.
type VolumeInfo struct {
	Name    string
	SizeMiB int
	Created time.Time
	// UsedBy lists the boxes (ids) whose options attach the volume.
	UsedBy []string
}

// volumes is the store of this home's named volumes.
func (r *Runtime) volumes() volume.Store {
	return volume.Store{Dir: filepath.Join(r.opts.Home, "volumes")}
}

// ErrVolumeInUse is returned by RemoveVolume for a volume a box attaches.
var ErrVolumeInUse = errors.New("volume in use")

// CreateVolume creates the named volume name of sizeMiB (0:
// DefaultVolumeSizeMiB): an ext4 image under Home/volumes, sparse on the
// host. An existing volume is an error.
func (r *Runtime) CreateVolume(ctx context.Context, name string, sizeMiB int) (VolumeInfo, error) {
	i, err := r.volumes().Create(ctx, name, sizeMiB)
	return VolumeInfo{Name: i.Name, SizeMiB: i.SizeMiB, Created: i.Created}, err
}

// volumeInfo is i with the boxes that attach it.
func volumeInfo(i volume.Info, boxes []BoxInfo) VolumeInfo {
	vi := VolumeInfo{Name: i.Name, SizeMiB: i.SizeMiB, Created: i.Created}
	for _, bi := range boxes {
		for _, v := range bi.Options.Volumes {
			if !v.IsHostDir() && v.Source == i.Name {
				vi.UsedBy = append(vi.UsedBy, bi.ID)
			}
		}
	}
	return vi
}

// Volumes lists the named volumes.
func (r *Runtime) Volumes(ctx context.Context) ([]VolumeInfo, error) {
	vols, err := r.volumes().List()
	if err != nil {
		return nil, err
	}
	boxes, err := r.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []VolumeInfo
	for _, i := range vols {
		out = append(out, volumeInfo(i, boxes))
	}
	return out, nil
}

// RemoveVolume deletes the named volume and its data. It is refused
// (ErrVolumeInUse) while a box, running or not, attaches it: remove the
// box first.
func (r *Runtime) RemoveVolume(ctx context.Context, name string) error {
	boxes, err := r.List(ctx)
	if err != nil {
		return err
	}
	i, err := r.volumes().Info(name)
	if err != nil {
		return err
	}
	if vi := volumeInfo(i, boxes); len(vi.UsedBy) > 0 {
		return fmt.Errorf("%w: %s is attached to box %s: remove the box first", ErrVolumeInUse, name, strings.Join(vi.UsedBy, ", "))
	}
	return r.volumes().Remove(name)
}

// prepareVolumes creates the named volumes vols attach that do not exist
// yet (host directories are checked by the driver, which knows its
// kernel).
func (r *Runtime) prepareVolumes(ctx context.Context, vols []Volume) error {
	return r.volumes().EnsureAll(ctx, mounts(vols))
}

// vmVolumes is how the driver attaches vols.
func (r *Runtime) vmVolumes(vols []Volume) []vmm.Volume {
	var out []vmm.Volume
	for _, v := range vols {
		mv := vmm.Volume{Target: v.Target, ReadOnly: v.ReadOnly}
		if v.IsHostDir() {
			mv.HostDir = v.Source
		} else {
			mv.Disk = r.volumes().Image(v.Source)
		}
		out = append(out, mv)
	}
	return out
}

// flushVolumes shuts a running box down cleanly before a forced removal
// when it has named volumes, so that what the box wrote to them is on
// disk (a killed VM loses the guest's page cache). Bounded: 10 s.
func (b *Box) flushVolumes(ctx context.Context, h vmm.Handle) {
	_, cfg := b.snapshot()
	named := false
	for _, v := range cfg.Options.Volumes {
		named = named || !v.IsHostDir()
	}
	if !named {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	c, err := b.client(cctx)
	if err != nil {
		return
	}
	b.vm.Stopping()
	if c.Shutdown(cctx) != nil {
		return
	}
	h.WaitGone(cctx)
}
