package guestinit

import (
	"fmt"
	"os"
	"path"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/tarfs"
)

var mountedVolumes []string

// MountVolumes mounts the volumes on the kernel command line in the box
// root, creating their mount points. Each mount point is resolved inside
// the box root (a symlink in the image cannot move it outside).
func MountVolumes() error {
	b, _ := os.ReadFile("/proc/cmdline")
	vols, err := guestabi.ParseVolumes(string(b))
	if err != nil || len(vols) == 0 {
		return err
	}
	root, err := tarfs.OpenRoot(NewRoot, tarfs.InRoot)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, v := range vols {
		if err := root.MkdirAll(v.Target, 0o755); err != nil {
			return fmt.Errorf("volume at %s: %w", v.Target, err)
		}
		fd, err := root.Open(v.Target, unix.O_PATH|unix.O_DIRECTORY, true)
		if err != nil {
			return fmt.Errorf("volume at %s: %w", v.Target, err)
		}
		target := fmt.Sprintf("/proc/self/fd/%d", fd)
		var flags uintptr = unix.MS_NOSUID | unix.MS_NODEV
		if v.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		switch v.Kind {
		case guestabi.VolumeKind9p:
			err = unix.Mount(v.Source, target, "9p", flags, "trans=virtio,version=9p2000.L,msize=524288,cache=none,access=client")
			if err == unix.ENODEV {
				err = fmt.Errorf("%w (this guest kernel has no 9p: use the airlock kernel)", err)
			}
		case guestabi.VolumeKindVirtioFS:
			err = unix.Mount(v.Source, target, "virtiofs", flags, "")
			if err == unix.ENODEV {
				err = fmt.Errorf("%w (this guest kernel has no virtio-fs: rebuild the airlock kernel with hack/build-kernel.sh)", err)
			}
		case guestabi.VolumeKindDisk:
			dev := "/dev/" + v.Source
			if err = waitFor(dev, 10*time.Second); err == nil {
				err = unix.Mount(dev, target, "ext4", flags|unix.MS_NOATIME, "")
				if err == unix.EROFS && v.ReadOnly {
					// A journal left to replay (its last box was killed)
					// cannot be replayed on a read-only disk.
					err = unix.Mount(dev, target, "ext4", flags|unix.MS_NOATIME, "noload")
				}
			}
		default:
			err = fmt.Errorf("unknown volume kind %q", v.Kind)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("mount volume %s at %s: %w", v.Source, v.Target, err)
		}
		mountedVolumes = append(mountedVolumes, path.Join(NewRoot, v.Target))
	}
	return nil
}

// unmountVolumes unmounts the volumes, last first, so named volumes'
// file systems are clean.
func unmountVolumes() {
	for i := len(mountedVolumes) - 1; i >= 0; i-- {
		if err := unix.Unmount(mountedVolumes[i], 0); err != nil {
			unix.Unmount(mountedVolumes[i], unix.MNT_DETACH)
		}
	}
}
