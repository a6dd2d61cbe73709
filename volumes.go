package airlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/airlock-run/airlock/internal/vmm"
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
const DefaultVolumeSizeMiB = 1024

var volumeName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// ParseVolume parses Docker's -v syntax: SOURCE:TARGET[:ro|:rw], where
// SOURCE is a host directory (absolute, or starting with "." for one
// relative to the working directory) or a volume name.
func ParseVolume(spec string) (Volume, error) {
	parts := strings.Split(spec, ":")
	var v Volume
	switch len(parts) {
	case 2:
	case 3:
		switch parts[2] {
		case "ro":
			v.ReadOnly = true
		case "rw":
		default:
			return v, fmt.Errorf("volume %q: mode %q: want ro or rw", spec, parts[2])
		}
	default:
		return v, fmt.Errorf("volume %q: want SOURCE:TARGET[:ro|rw] (SOURCE a host directory or a volume name)", spec)
	}
	v.Source, v.Target = parts[0], parts[1]
	if strings.HasPrefix(v.Source, ".") || strings.HasPrefix(v.Source, "~") {
		abs, err := filepath.Abs(v.Source)
		if err != nil {
			return v, err
		}
		v.Source = abs
	}
	return v, checkVolume(v)
}

func checkVolume(v Volume) error {
	if !path.IsAbs(v.Target) || path.Clean(v.Target) == "/" {
		return fmt.Errorf("volume %s: target %q must be an absolute path other than /", v.Source, v.Target)
	}
	if !v.IsHostDir() && !volumeName.MatchString(v.Source) {
		return fmt.Errorf("volume %q: not an absolute host path, nor a volume name (letters, digits, _ . -)", v.Source)
	}
	return nil
}

func checkVolumes(vs []Volume) error {
	seen := map[string]bool{}
	for _, v := range vs {
		if err := checkVolume(v); err != nil {
			return err
		}
		t := path.Clean(v.Target)
		if seen[t] {
			return fmt.Errorf("two volumes at %s", t)
		}
		seen[t] = true
	}
	return nil
}

// VolumeInfo describes a named volume.
type VolumeInfo struct {
	Name    string
	SizeMiB int
	Created time.Time
	// UsedBy lists the boxes (ids) whose options attach the volume.
	UsedBy []string
}

type volumeMeta struct {
	SizeMiB int       `json:"size_mib"`
	Created time.Time `json:"created"`
}

func (r *Runtime) volumeDir(name string) string { return filepath.Join(r.opts.Home, "volumes", name) }

func (r *Runtime) volumeImage(name string) string {
	return filepath.Join(r.volumeDir(name), "volume.ext4")
}

// ErrVolumeInUse is returned by RemoveVolume for a volume a box attaches.
var ErrVolumeInUse = errors.New("volume in use")

// CreateVolume creates the named volume name of sizeMiB (0:
// DefaultVolumeSizeMiB): an ext4 image under Home/volumes, sparse on the
// host. An existing volume is an error.
func (r *Runtime) CreateVolume(ctx context.Context, name string, sizeMiB int) (VolumeInfo, error) {
	if !volumeName.MatchString(name) {
		return VolumeInfo{}, fmt.Errorf("volume name %q: want letters, digits, _ . - (up to 64)", name)
	}
	if sizeMiB == 0 {
		sizeMiB = DefaultVolumeSizeMiB
	}
	if sizeMiB < 8 {
		return VolumeInfo{}, fmt.Errorf("volume %s: size %d MiB: want at least 8", name, sizeMiB)
	}
	dir := r.volumeDir(name)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return VolumeInfo{}, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return VolumeInfo{}, fmt.Errorf("volume %s already exists", name)
		}
		return VolumeInfo{}, err
	}
	fail := func(err error) (VolumeInfo, error) {
		os.RemoveAll(dir)
		return VolumeInfo{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	img := r.volumeImage(name)
	f, err := os.Create(img)
	if err != nil {
		return fail(err)
	}
	err = f.Truncate(int64(sizeMiB) << 20)
	f.Close()
	if err != nil {
		return fail(err)
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-L", "airlock-vol",
		"-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", img).CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("mkfs.ext4: %v: %s", err, out))
	}
	m := volumeMeta{SizeMiB: sizeMiB, Created: time.Now().UTC()}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, "volume.json"), b, 0o600); err != nil {
		return fail(err)
	}
	return VolumeInfo{Name: name, SizeMiB: sizeMiB, Created: m.Created}, nil
}

func (r *Runtime) volumeInfo(ctx context.Context, name string, boxes []BoxInfo) (VolumeInfo, error) {
	b, err := os.ReadFile(filepath.Join(r.volumeDir(name), "volume.json"))
	if err != nil {
		return VolumeInfo{}, fmt.Errorf("volume %s: no such volume (airlock volume ls)", name)
	}
	var m volumeMeta
	json.Unmarshal(b, &m)
	vi := VolumeInfo{Name: name, SizeMiB: m.SizeMiB, Created: m.Created}
	for _, bi := range boxes {
		for _, v := range bi.Options.Volumes {
			if !v.IsHostDir() && v.Source == name {
				vi.UsedBy = append(vi.UsedBy, bi.ID)
			}
		}
	}
	return vi, nil
}

// Volumes lists the named volumes.
func (r *Runtime) Volumes(ctx context.Context) ([]VolumeInfo, error) {
	ents, err := os.ReadDir(filepath.Join(r.opts.Home, "volumes"))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	boxes, err := r.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []VolumeInfo
	for _, e := range ents {
		if vi, err := r.volumeInfo(ctx, e.Name(), boxes); err == nil {
			out = append(out, vi)
		}
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
	vi, err := r.volumeInfo(ctx, name, boxes)
	if err != nil {
		return err
	}
	if len(vi.UsedBy) > 0 {
		return fmt.Errorf("%w: %s is attached to box %s: remove the box first", ErrVolumeInUse, name, strings.Join(vi.UsedBy, ", "))
	}
	return os.RemoveAll(r.volumeDir(name))
}

// prepareVolumes creates the named volumes vols attach that do not exist
// yet (host directories are checked by the driver, which knows its
// kernel).
func (r *Runtime) prepareVolumes(ctx context.Context, vols []Volume) error {
	for _, v := range vols {
		if v.IsHostDir() {
			continue
		}
		if _, err := os.Stat(r.volumeImage(v.Source)); os.IsNotExist(err) {
			if _, err := r.CreateVolume(ctx, v.Source, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// vmVolumes is how the driver attaches vols.
func (r *Runtime) vmVolumes(vols []Volume) []vmm.Volume {
	var out []vmm.Volume
	for _, v := range vols {
		mv := vmm.Volume{Target: v.Target, ReadOnly: v.ReadOnly}
		if v.IsHostDir() {
			mv.HostDir = v.Source
		} else {
			mv.Disk = r.volumeImage(v.Source)
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
	b.mu.Lock()
	b.stopping = true
	b.mu.Unlock()
	if c.Shutdown(cctx) != nil {
		return
	}
	for h.Alive() && cctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
}
