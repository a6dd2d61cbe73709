//go:build linux

// Package guestinit does what the guest agent must do as PID 1 before it can
// serve the host: mount the pseudo filesystems, load kernel modules shipped
// in the initramfs (distribution kernels only; the airlock kernel has them
// built in), assemble the box root (read-only image base + writable layer,
// joined by overlayfs), configure the network, and later power off cleanly.
//
// Everything it needs comes from the kernel command line (airlock.*
// parameters, see Params).
package guestinit

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/guestabi"
)

// NewRoot is where the box root is assembled; processes are chrooted here.
const NewRoot = "/newroot"

// ModulesDir holds the .ko files and modules.load (one file name per line,
// dependency order) in the initramfs.
const ModulesDir = "/lib/modules/airlock"

// Params are the airlock.* kernel command line parameters (see
// guestabi.Boot, which the host encodes them with).
type Params = guestabi.Boot

// Uptime returns the time since the guest booted (CLOCK_BOOTTIME).
func Uptime() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return time.Duration(ts.Nano()).Round(time.Millisecond)
}

// ParseCmdline reads the airlock.* parameters from a kernel command line.
func ParseCmdline(cmdline string) Params { return guestabi.ParseCmdline(cmdline) }

func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil && err != unix.EBUSY {
		return fmt.Errorf("mount %s on %s (%s): %w", src, dst, fstype, err)
	}
	return nil
}

// Logf writes a line to the console (the serial log on the host).
func Logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, guestabi.LogPrefix+format+"\n", a...)
}

// Early mounts /dev, /proc and /sys in the initial root (the initramfs or
// the read-only agent disk, whose mount points exist) and loads modules.
func Early() (Params, error) {
	for _, m := range []struct{ src, dst, t string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		if err := mount(m.src, m.dst, m.t, unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
			return Params{}, err
		}
	}
	b, _ := os.ReadFile("/proc/cmdline")
	p := ParseCmdline(string(b))
	if err := LoadModules(); err != nil {
		return p, err
	}
	return p, nil
}

// LoadModules loads the kernel modules listed in ModulesDir/modules.load, in
// order (Debian kernels; the airlock kernel has none).
func LoadModules() error {
	f, err := os.Open(filepath.Join(ModulesDir, "modules.load"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		mf, err := os.Open(filepath.Join(ModulesDir, name))
		if err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		err = unix.FinitModule(int(mf.Fd()), "", 0)
		mf.Close()
		if err != nil && err != unix.EEXIST {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return sc.Err()
}

func waitFor(path string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", path, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// MountRoot assembles the box root at NewRoot: the base image read-only,
// the writable layer (an ext4 disk, or tmpfs), overlayfs over both, and the
// usual pseudo filesystems inside it.
func MountRoot(p Params) error {
	if err := waitFor(p.Root, 10*time.Second); err != nil {
		return err
	}
	if err := mount(p.Root, "/mnt/base", p.RootFSType, unix.MS_RDONLY, ""); err != nil {
		return err
	}
	if p.RW != "" {
		if err := waitFor(p.RW, 10*time.Second); err != nil {
			return err
		}
		// no_prefetch_block_bitmaps: without it the kernel's ext4lazyinit
		// thread reads every group's block bitmap in the seconds after
		// the mount, which a memory snapshot of a young box carries into
		// every restore (its inode tables need no zeroing: the writable
		// layer is made with assume_storage_prezeroed, see rootfs). The
		// allocator reads a group's bitmap when it first needs it.
		if err := mount(p.RW, "/mnt/rw", "ext4", unix.MS_NOATIME, "no_prefetch_block_bitmaps"); err != nil {
			return err
		}
	} else if err := mount("tmpfs", "/mnt/rw", "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	for _, d := range []string{"/mnt/rw/upper", "/mnt/rw/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := mount("overlay", NewRoot, "overlay", 0,
		"lowerdir=/mnt/base,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work"); err != nil {
		return err
	}
	r := func(p string) string { return filepath.Join(NewRoot, p) }
	for _, m := range []struct {
		src, dst, t string
		flags       uintptr
		data        string
	}{
		{"proc", r("/proc"), "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", r("/sys"), "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"cgroup2", r("/sys/fs/cgroup"), "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devtmpfs", r("/dev"), "devtmpfs", unix.MS_NOSUID, ""},
		{"devpts", r("/dev/pts"), "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"},
		{"tmpfs", r("/dev/shm"), "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", r("/run"), "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	} {
		if err := mount(m.src, m.dst, m.t, m.flags, m.data); err != nil {
			return err
		}
	}
	// /tmp must exist and be world-writable, as in every image.
	os.MkdirAll(r("/tmp"), 0o1777)
	return nil
}

// Hostname sets the box's hostname and gives the box its /etc/hostname
// and /etc/hosts (localhost and the name), as Docker does.
func Hostname(name string) {
	unix.Sethostname([]byte(name))
	provideEtcFile("hostname", []byte(name+"\n"), false)
	provideEtcFile("hosts", []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t"+name+"\n"), true)
}

// etcDir is a small tmpfs in the agent's own root, outside the box root,
// holding the files the agent gives the box's /etc (see provideEtcFile).
const etcDir = "/mnt/etc"

var etcMounted bool

// etcBound holds the names provideEtcFile has bind-mounted: providing one
// again (a restored box takes a new hostname) rewrites the file under the
// mount in place, rather than stacking another mount on every restore.
var etcBound = map[string]bool{}

// rewrite replaces the content of the file at p in place: written over
// from the start, and cut only when it was longer (the box may have
// changed it). On tmpfs this keeps the file's page, where O_TRUNC freed it
// and the write allocated another: a restored box rewrites /etc/hostname
// and /etc/hosts before its first exec, and under TCG each kernel path
// that runs for the first time since the restore is translated anew.
func rewrite(p string, content []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err == nil {
		_, err = f.WriteAt(content, 0)
	}
	if err == nil && fi.Size() > int64(len(content)) {
		err = f.Truncate(int64(len(content)))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// provideEtcFile gives the box /etc/name with content. Like Docker, it
// bind-mounts a file of etcDir over the image's file: nothing is copied up
// into the writable layer (under TCG, the first write through overlayfs and
// ext4 cost ~35 ms of every boot), and the file is made anew at every start.
// Package rootfs puts empty files in every base to mount over. Where the
// image has no regular file there (a base of an older recipe, or a symlink)
// it is written into the box root instead when create is set.
//
// The image (and, in a box restored from a snapshot, the box's own root
// processes) decide what /etc and /etc/name are: /etc is resolved as the
// box would resolve it and never out of the box root's file system, and a
// symlink at /etc/name is replaced, never followed (see openEtc and
// createEtcFile): an image's /etc/hosts -> /proc/sys/kernel/... or a /etc
// pointing into the agent's own mounts must not make the agent write there.
func provideEtcFile(name string, content []byte, create bool) error {
	if etcBound[name] {
		if err := rewrite(filepath.Join(etcDir, name), content); err == nil {
			return nil
		}
	}
	etc, err := openEtc(NewRoot)
	if err != nil {
		Logf("/etc/%s not provided: %v", name, err)
		return err
	}
	defer unix.Close(etc)
	if dst, err := unix.Openat(etc, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
		var st unix.Stat_t
		regular := unix.Fstat(dst, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
		if regular && !etcMounted {
			if err := mount("tmpfs", etcDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=1m"); err == nil {
				etcMounted = true
			}
		}
		src := filepath.Join(etcDir, name)
		// The mount goes on the file dst holds, named through its
		// descriptor: a path would be resolved again, symlinks and all.
		bound := regular && etcMounted && os.WriteFile(src, content, 0o644) == nil &&
			unix.Mount(src, "/proc/self/fd/"+strconv.Itoa(dst), "", unix.MS_BIND, "") == nil
		unix.Close(dst)
		if bound {
			etcBound[name] = true
			return nil
		}
	}
	if !create {
		return nil
	}
	return createEtcFile(etc, name, content)
}

// openEtc opens (O_PATH) the /etc directory of the box root at root,
// resolving symlinks on the way as the box would (inside root), and
// refusing one that leads onto another file system (/proc, /sys, a
// volume) or through a /proc magic link.
func openEtc(root string) (int, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, "etc", &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return -1, fmt.Errorf("the box's /etc: %w", err)
	}
	return fd, nil
}

// createEtcFile writes content to a new regular file name in the
// directory etc (a descriptor), mode 0644, in place of whatever non-directory
// was there: a symlink (maybe dangling, maybe to a file outside the box)
// is removed, not followed, and a symlink made meanwhile makes the create
// fail (O_EXCL, O_NOFOLLOW) rather than be followed.
func createEtcFile(etc int, name string, content []byte) error {
	if err := unix.Unlinkat(etc, name, 0); err != nil && err != unix.ENOENT {
		return fmt.Errorf("/etc/%s: %w", name, err)
	}
	fd, err := unix.Openat(etc, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("/etc/%s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = f.Write(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// PowerOff stops every process, flushes and unmounts the writable layer and
// powers the VM off (QEMU runs with -no-reboot, so a restart ends it).
func PowerOff() {
	unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if onlyMe() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
	unmountVolumes()
	// Unmount the overlay and its layers so the ext4 layer is clean.
	var mounts []string
	for _, f := range guestabi.EtcFiles {
		mounts = append(mounts, "/etc/"+f)
	}
	mounts = append(mounts, "/sys/fs/cgroup", "/dev/pts", "/dev/shm", "/dev", "/proc", "/sys", "/run")
	for _, m := range mounts {
		unix.Unmount(filepath.Join(NewRoot, m), unix.MNT_DETACH)
	}
	unix.Unmount(NewRoot, 0)
	if err := unix.Mount("", "/mnt/rw", "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		unix.Unmount("/mnt/rw", unix.MNT_DETACH)
	}
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
}

func onlyMe() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		if e.Name() == "1" {
			continue
		}
		if c := e.Name()[0]; c < '0' || c > '9' {
			continue
		}
		// Kernel threads have an empty cmdline.
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && len(b) > 0 {
			return false
		}
	}
	return true
}
