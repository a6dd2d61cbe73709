package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Disk is a raw disk image attached as a virtio-blk device. Disks appear in
// the guest as /dev/vda, /dev/vdb, ... in the order given.
type Disk struct {
	Path     string
	ReadOnly bool
	// OptIOSize, when non-zero, is the optimal I/O size in bytes the
	// device advertises (virtio-blk topology; a multiple of 512). Linux
	// sets the disk's readahead to twice this (never below its 128 KiB
	// default), so a small disk read at boot, like the agent disk, comes in
	// a few large requests instead of one per page fault.
	OptIOSize int
}

// Share is a host directory shared over virtio-9p: fsdev ID, mount tag Tag.
// Files are shared with security_model=mapped-xattr: the guest's owners and
// modes live in extended attributes, so a box cannot make a setuid file on
// the host; a read-only share has readonly=on, which QEMU enforces.
type Share struct {
	ID, Tag, HostDir string
	ReadOnly         bool
	// FileMode and DirMode are the host modes of the files and
	// directories the guest creates (QEMU's fmode and dmode; the guest's
	// own modes stay in the extended attributes): 0 leaves QEMU's
	// defaults, 0600 and 0700. volumeDevices sets them from the host's
	// umask (HostModes), as a host program's new files would have.
	FileMode, DirMode os.FileMode
}

// HostModes are the modes a host program's new files and directories get
// under this process's umask (0644 and 0755 under 022): read from
// /proc/self/status (Linux 4.7+), since umask(2) can only read it by
// changing it, which races other threads; 0600 and 0700, QEMU's own
// defaults, when it cannot be read.
func HostModes() (file, dir os.FileMode) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0o600, 0o700
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil {
				break
			}
			// Never more than the owner's read and write (and search):
			// the owner keeps access whatever the umask says.
			u := os.FileMode(m) & 0o077
			return 0o666 &^ u, 0o777 &^ u
		}
	}
	return 0o600, 0o700
}

// FSShare is a host directory shared over virtio-fs: a vhost-user-fs
// device with chardev ID and mount tag Tag whose backend, a virtiofsd
// (see virtiofsd.go), listens on the unix socket Socket. QEMU connects to
// it: an unconfined QEMU by path, a confined one through a descriptor the
// launcher stage connected before it dropped root (the socket is root's,
// mode 0700, and not in the jail).
type FSShare struct {
	ID, Tag, Socket string
}

// Config describes one VM.
type Config struct {
	Binary    string // default "qemu-system-x86_64"
	Name      string // shown in ps as -name; should contain the box id
	Accel     string // AccelKVM or AccelTCG
	CPUs      int    // vCPUs, default 1
	MemoryMiB int    // guest RAM in MiB, default 512
	Kernel    string // uncompressed vmlinux (PVH entry) or bzImage
	Initrd    string // newc cpio; "" boots without an initramfs (root= on the command line)
	Cmdline   string // kernel command line
	Disks     []Disk
	// AgentSockets are the host unix sockets of the agent's virtio-serial
	// ports (QEMU listens on them); port i is named guestabi.PortName(i). A socket
	// takes one host connection at a time, so several ports let several
	// host processes talk to the agent at once.
	AgentSockets []string
	QMPSocket    string
	ConsoleLog   string // serial console output
	// ConsoleMax caps a confined box's console log in bytes (default
	// DefaultConsoleMax): a drainer process keeps its newest part. An
	// unconfined QEMU (Jail.Off) writes the log itself, without a cap.
	ConsoleMax int64
	PIDFile    string
	// VsockCID, when non-zero, attaches a vhost-vsock device with this
	// guest CID (needs /dev/vhost-vsock on the host; see VsockAvailable).
	VsockCID uint32
	// Network attaches a virtio-net NIC; false = no NIC at all. Its
	// backend is NetSocket, or QEMU user-mode networking (slirp: full
	// outbound access through the host, the host's loopback included) when
	// NetSocket is "" (only benchmarks compare against it).
	Network bool
	// NetSocket is the unix socket on which QEMU listens (-netdev stream,
	// server=on) for a user-mode network stack, airlock's network helper,
	// to connect: frames go as a 4-byte big-endian length and the Ethernet
	// frame. The NIC has no link until then.
	NetSocket string
	// NetMTU, when non-zero, is the MTU the NIC advertises to the guest
	// (virtio-net host_mtu), which the guest's driver adopts.
	NetMTU int
	// THP says where QEMU may use transparent huge pages (THPAll, the
	// zero value, THPCode or THPNone).
	THP THPMode
	// NoACPI starts microvm without ACPI tables (-M microvm,acpi=off). The
	// kernel then finds the APICs in the MP table (CONFIG_X86_MPPARSE) and
	// its devices in the virtio_mmio.device= parameters QEMU appends to the
	// command line (CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES), and it has a PIT.
	// Used, with the kernel parameter "noapictimer", for single-vCPU boxes
	// under TCG: the PIT is then the clock event device, and the boot skips
	// the local APIC timer calibration, a 100 ms busy wait that TCG, lacking
	// a TSC-deadline timer and the CPUID leaf with the APIC bus rate, cannot
	// shortcut (boxes started ~0.15 s sooner here; idle QEMU used 3.6% of a
	// host core instead of 2.7%). Kernels without those options (Debian's)
	// boot with ACPI.
	NoACPI bool
	// Shares are host directories shared with the guest over virtio-9p
	// (volumes). A confined QEMU sees each at its host path, bind-mounted
	// into its jail (read-only for a read-only share).
	Shares []Share
	// FSShares are host directories shared over virtio-fs (volumes with
	// the virtio-fs transport). With any, guest RAM is one shared memfd
	// (sharedRAMArgs) that the daemons map, shared with them.
	FSShares []FSShare
	// Incoming starts QEMU waiting for a migration stream (-incoming
	// defer) instead of booting: QMP migrate-incoming then loads a
	// snapshot, after which the machine stays stopped (-S) until QMP
	// cont.
	Incoming bool
	// Secret, when set, is given to the guest on the virtio-serial port
	// guestabi.SecretPort (through a socket pair QEMU inherits: it appears in no
	// command line and no file another user can read). The agent then
	// serves only hosts that prove they know it (transport handshake).
	Secret []byte
	// Jail says how QEMU is confined (see Jail); the zero value confines.
	Jail Jail
	// RAMImages, for a restore (Incoming) with guest RAM in a memfd, are
	// sealed memfds holding the RAM image of the snapshot's parts (by part
	// index; nil: that part comes from the migration stream). QEMU maps
	// each privately (copy-on-write) through /proc/self/fd (see
	// ramimage.go), so restores of one image share its untouched pages.
	RAMImages []*os.File `json:"-"`
	// RAMCopy says the RAM images are this box's own copies (unsealed
	// memfds): QEMU maps them shared, as a booted box's memfds, and a
	// snapshot of the box reads them as those.
	RAMCopy bool `json:"-"`
}

// ramImageFDs returns the descriptor numbers QEMU gets c's RAM images at
// (by part index; -1 for none), the first at base, in order.
func (c Config) ramImageFDs(base int) []int {
	fds := make([]int, len(c.RAMImages))
	for i, f := range c.RAMImages {
		fds[i] = -1
		if f != nil {
			fds[i] = base
			base++
		}
	}
	return fds
}

// ramImageRefs returns the mem-path values of c's RAM images for QEMU
// descriptors fds (ramImageFDs).
func ramImageRefs(fds []int) []string {
	refs := make([]string, len(fds))
	for i, fd := range fds {
		if fd >= 0 {
			refs[i] = "/proc/self/fd/" + strconv.Itoa(fd)
		}
	}
	return refs
}

// unconfinedFDBase is the first descriptor an unconfined QEMU gets its RAM
// images at: after /dev/null and the secret's socket pair (Launch).
func (c Config) unconfinedFDBase() int {
	if c.Secret != nil {
		return fdSecretPeer + 1
	}
	return 3
}

// Args returns QEMU's arguments for c (without the binary) when QEMU is
// not confined (Jail.Off): host paths, -daemonize.
func (c Config) Args() []string {
	refs := argRefs{kernel: c.Kernel, initrd: c.Initrd,
		console: "path=" + escapeComma(c.ConsoleLog),
		qmp:     []string{"-qmp", "unix:" + c.QMPSocket + ",server=on,wait=off"},
		net:     "addr.type=unix,addr.path=" + escapeComma(c.NetSocket),
		tail:    []string{"-pidfile", c.PIDFile, "-daemonize"},
		ram:     ramImageRefs(c.ramImageFDs(c.unconfinedFDBase()))}
	for _, d := range c.Disks {
		refs.disks = append(refs.disks, escapeComma(d.Path))
	}
	for _, sock := range c.AgentSockets {
		refs.agents = append(refs.agents, "path="+escapeComma(sock)+",server=on,wait=off")
	}
	return c.args(refs)
}

// argRefs says how QEMU's arguments name the files and sockets of a box:
// host paths, or jail paths and inherited descriptors.
type argRefs struct {
	kernel, initrd string
	disks          []string // -drive file= values
	diskOpts       string   // more -drive options for every disk
	console        string   // the console chardev's file options
	agents         []string // each agent socket chardev's options
	qmp            []string // the QMP monitor's arguments
	net            string   // the stream netdev's address options
	shares         []string // each share's directory as QEMU sees it ("": its host path)
	fsShares       []string // each virtio-fs share's chardev address options ("": its socket's path)
	ram            []string // each RAM part's image file as QEMU opens it ("": none)
	tail           []string // appended last
}

func (c Config) args(refs argRefs) []string {
	cpus, mem := c.CPUs, c.MemoryMiB
	if cpus <= 0 {
		cpus = 1
	}
	if mem <= 0 {
		mem = 512
	}
	machine := "microvm"
	if c.NoACPI {
		machine += ",acpi=off"
	}
	a := []string{
		"-name", c.Name,
		"-M", machine,
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-m", strconv.Itoa(mem),
		"-smp", strconv.Itoa(cpus),
	}
	if len(c.FSShares) > 0 {
		a = append(a, sharedRAMArgs(mem)...)
	} else if c.THP.memfdRAM() {
		image := ""
		if len(refs.ram) > 0 {
			image = refs.ram[0]
		}
		a = append(a, ramArgs(mem, c.Incoming, image, c.RAMCopy)...)
	}
	if c.Accel == AccelKVM {
		a = append(a, "-accel", "kvm", "-cpu", "host")
	} else {
		// No ERMS/FSRM: with them the guest kernel and glibc clear and
		// copy memory with `rep stosb/movsb`, which TCG runs a byte per
		// iteration. Without them, zeroing 100 MB in the guest took 0.15-0.25 s
		// instead of 0.7 s and copying it 0.2-0.3 s instead of 0.3-0.5 s. They are
		// speed hints only: the instructions work either way.
		a = append(a, "-accel", "tcg", "-cpu", "max,-erms,-fsrm")
	}
	a = append(a,
		"-kernel", refs.kernel,
		"-append", c.Cmdline,
		"-chardev", "file,id=console,"+refs.console,
		"-serial", "chardev:console",
	)
	a = append(a, refs.qmp...)
	if refs.initrd != "" {
		a = append(a, "-initrd", refs.initrd)
	}
	if c.Incoming {
		// -S: stopped once the state is loaded, whatever the stream's
		// run state; the caller continues it (cont) when the guest may run.
		a = append(a, "-S", "-incoming", "defer")
	}
	for i, d := range c.Disks {
		id := "vd" + string(rune('a'+i))
		ro := "off"
		if d.ReadOnly {
			ro = "on"
		}
		dev := "virtio-blk-device,drive=" + id
		if d.OptIOSize > 0 {
			dev += ",opt_io_size=" + strconv.Itoa(d.OptIOSize)
		}
		a = append(a,
			"-drive", fmt.Sprintf("id=%s,file=%s,format=raw,if=none,readonly=%s,cache=unsafe,discard=unmap%s", id, refs.disks[i], ro, refs.diskOpts),
			"-device", dev)
	}
	ports := len(c.AgentSockets) + 1
	if c.Secret != nil {
		ports++
	}
	a = append(a, "-device", fmt.Sprintf("virtio-serial-device,max_ports=%d", ports))
	for i := range c.AgentSockets {
		id := "agent" + strconv.Itoa(i)
		a = append(a,
			"-chardev", "socket,id="+id+","+refs.agents[i],
			"-device", "virtserialport,chardev="+id+",name="+guestabi.PortName(i))
	}
	if c.Secret != nil {
		// One end of a socket pair that holds the secret and then EOF:
		// QEMU hands the bytes to the guest when the agent opens the port.
		a = append(a,
			"-chardev", "socket,id=secret,fd="+strconv.Itoa(fdSecret),
			"-device", "virtserialport,chardev=secret,name="+guestabi.SecretPort)
	}
	a = append(a,
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng0",
	)
	if c.Network && c.NetSocket != "" {
		// status=off: no link status field. The link is the network
		// helper's stream and never goes down while the box runs; with
		// the field the guest driver turns the carrier off and on again
		// at probe, and the kernel's link watch, which runs at most once
		// a second, left that second event pending for ~1 s after boot:
		// inside every snapshot of a young box, run after each restore.
		// (QEMU's guest announcement needs the field too.)
		dev := "virtio-net-device,netdev=net0,status=off"
		if c.NetMTU > 0 {
			dev += ",host_mtu=" + strconv.Itoa(c.NetMTU)
		}
		a = append(a, "-netdev", "stream,id=net0,server=on,"+refs.net, "-device", dev)
	} else if c.Network {
		a = append(a, "-netdev", "user,id=net0", "-device", "virtio-net-device,netdev=net0")
	}
	if c.VsockCID != 0 {
		a = append(a, "-device", fmt.Sprintf("vhost-vsock-device,guest-cid=%d", c.VsockCID))
	}
	for i, sh := range c.Shares {
		p := sh.HostDir
		if i < len(refs.shares) {
			p = refs.shares[i]
		}
		fsdev := "local,id=" + sh.ID + ",path=" + escapeComma(p) + ",security_model=mapped-xattr"
		if sh.ReadOnly {
			fsdev += ",readonly=on"
		}
		if sh.FileMode != 0 {
			fsdev += fmt.Sprintf(",fmode=%04o", sh.FileMode.Perm())
		}
		if sh.DirMode != 0 {
			fsdev += fmt.Sprintf(",dmode=%04o", sh.DirMode.Perm())
		}
		a = append(a, "-fsdev", fsdev, "-device", "virtio-9p-device,fsdev="+sh.ID+",mount_tag="+sh.Tag)
	}
	for i, sh := range c.FSShares {
		addr := "path=" + escapeComma(sh.Socket)
		if i < len(refs.fsShares) {
			addr = refs.fsShares[i]
		}
		a = append(a, "-chardev", "socket,id="+sh.ID+","+addr,
			"-device", "vhost-user-fs-device,chardev="+sh.ID+",tag="+sh.Tag)
	}
	return append(a, refs.tail...)
}

// VsockAvailable reports whether the host can give guests a vsock device
// (the vhost_vsock module, /dev/vhost-vsock, is usable).
func VsockAvailable() bool {
	f, err := os.OpenFile("/dev/vhost-vsock", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// IsCIDInUse reports whether a Launch error means the vsock guest CID is
// taken by another VM (retry with another CID).
func IsCIDInUse(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "guest-cid") || strings.Contains(err.Error(), "Address already in use"))
}

// THPMode says where QEMU may use transparent huge pages. QEMU asks for
// them (MADV_HUGEPAGE) for guest RAM and for TCG's translated-code buffer.
// Huge pages for guest RAM cost 2 MiB of host memory for every 2 MiB
// region the guest touches at all; with 4 KiB pages it costs what the guest
// really touched, at the price of 512 times as many page faults. On a host
// that is itself a VM, a fault on a huge page is often the dearer one: the
// host's free memory goes back to its hypervisor, and the first touch of
// each huge page then waits for the hypervisor to provide and zero 2 MiB
// (docs/performance.md).
type THPMode int

const (
	// THPAll lets QEMU use huge pages where it asks for them, guest RAM
	// (anonymous memory) included.
	THPAll THPMode = iota
	// THPCode keeps guest RAM on 4 KiB pages, in a memfd (ramLayout: the
	// kernel backs memfds with huge pages only where shmem_enabled says
	// so, "never" by default), and lets TCG's translated-code buffer and
	// QEMU's heap use huge pages.
	THPCode
	// THPNone keeps guest RAM in a memfd as THPCode does and starts QEMU
	// with transparent huge pages disabled (prctl PR_SET_THP_DISABLE), its
	// code buffer and heap included.
	THPNone
)

// memfdRAM reports whether guest RAM is in a memfd (ramLayout) rather
// than anonymous memory.
func (m THPMode) memfdRAM() bool { return m != THPAll }

// String returns "on", "code" or "off" (the AIRLOCK_THP values).
func (m THPMode) String() string {
	switch m {
	case THPCode:
		return "code"
	case THPNone:
		return "off"
	}
	return "on"
}

// escapeComma doubles commas, QEMU's option-value escape.
func escapeComma(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// KernelCmdline returns the kernel command line for a box: a quiet console
// on ttyS0 (verbose with debug), no timer check, no reboot
// loop (panic=-1 with QEMU's -no-reboot ends the VM on panic), plus the
// TCG-only clock hints and norandmaps when accel is TCG, followed by extra.
// tscKHz is the host's TSC rate (TSCkHz), used only under TCG; 0 measures it
// without a cache.
func KernelCmdline(accel string, debug bool, tscKHz uint64, extra ...string) string {
	p := append([]string(nil), baseParams...)
	if !debug {
		p = append(p, quietParams...)
	}
	if accel == AccelTCG {
		// TCG's PIT calibration fails on microvm (the boot can hang); tell
		// the kernel the TSC rate, which under TCG is the host's. TCG's TSC
		// follows the host clock and is the same on every vCPU, but the
		// kernel's TSC sync check fails between vCPUs it runs one after the
		// other: without tsc=reliable, boxes with 2+ vCPUs ran on the jiffies
		// clocksource (sleeps rounded up to 4 ms ticks).
		if tscKHz == 0 {
			tscKHz = TSCkHz("")
		}
		p = append(p, tscKHzParam+strconv.FormatUint(tscKHz, 10))
		p = append(p, tcgParams...)
		// No address-space randomization in the guest: QEMU's TCG (before
		// 8.0 on x86) finds translated code by virtual address, so with
		// randomized mmap bases every process start translated the dynamic
		// loader and libc again: fork+exec of /bin/true took ~30 ms in the
		// guest instead of ~5 ms. Randomization inside a box protects
		// nothing: its processes are the untrusted code, and the wall is
		// the VM.
		p = append(p, noRandMaps)
	}
	return strings.Join(append(p, extra...), " ")
}

// The kernel parameters KernelCmdline and the driver write, other than
// guestabi's airlock.* ones: CheckCmdline accepts these and no others.
var (
	baseParams = []string{
		"console=ttyS0", "reboot=t", "panic=-1",
		"no_timer_check", "i8042.noaux", "i8042.nopnp", "i8042.dumbkbd",
		"random.trust_cpu=on", "audit=0", "nokaslr", "mitigations=off", "pty.legacy_count=0",
		"8250.nr_uarts=1", // one UART: ttyS0; probing the default four costs ~60 ms under TCG
	}
	quietParams = []string{"quiet", "loglevel=1"}
	tcgParams   = []string{"tsc=reliable", "noreplace-smp"}
	// agentDiskParams boot the agent disk as the kernel's root (no
	// initramfs): Driver.config.
	agentDiskParams = []string{"root=/dev/vda", "rootfstype=erofs", "ro", "init=/init"}
)

const (
	tscKHzParam    = "tsc_early_khz="
	noRandMaps     = "norandmaps"
	noAPICTimer    = "noapictimer"
	maxCmdlineSize = 4096 // bytes; the kernel's own limit on x86 is 2048
)

// CheckCmdline returns an error naming the first parameter of cmdline that
// airlock does not write: the kernel command line of a snapshot or an
// imported memory archive reaches QEMU's -append, and one that came from
// elsewhere could carry init=, rdinit=, module parameters or a "--" tail
// for /init. Accepted are KernelCmdline's parameters, the driver's own
// (agent disk root, noapictimer) and guestabi.KnownParam's, each with a
// value of the form airlock writes; quotes, control bytes and command lines
// over 4096 bytes are refused.
func CheckCmdline(cmdline string) error {
	if len(cmdline) > maxCmdlineSize {
		return fmt.Errorf("kernel command line of %d bytes (airlock writes at most %d): refused", len(cmdline), maxCmdlineSize)
	}
	for i := 0; i < len(cmdline); i++ {
		if c := cmdline[i]; c == '"' || c < 0x20 && c != ' ' || c >= 0x7f {
			return fmt.Errorf("kernel command line has byte %#x (airlock writes printable ASCII, no quotes): refused", c)
		}
	}
	for _, f := range strings.Fields(cmdline) {
		if !knownParam(f) {
			return fmt.Errorf("kernel command line has parameter %q, which airlock does not write: refused (a snapshot or memory archive that was not written by airlock, or was altered)", f)
		}
	}
	return nil
}

func knownParam(f string) bool {
	if slices.Contains(baseParams, f) || slices.Contains(quietParams, f) || slices.Contains(tcgParams, f) ||
		slices.Contains(agentDiskParams, f) || f == noRandMaps || f == noAPICTimer || guestabi.KnownParam(f) {
		return true
	}
	if v, ok := strings.CutPrefix(f, tscKHzParam); ok {
		n, err := strconv.ParseUint(v, 10, 64)
		return err == nil && n > 0 && len(v) <= 10
	}
	return false
}

var tscOnce struct {
	sync.Once
	khz uint64
}

// TSCkHz returns the host's TSC rate in kHz (2800000 when it cannot be
// measured). The rate is fixed for a host boot, so the measurement (~45 ms)
// is made once per boot and kept in a small file in cacheDir, the user's
// airlock cache (tscCachePath), named after the kernel's boot id; it is
// read and written without following symlinks. With cacheDir "" nothing is
// kept on disk.
func TSCkHz(cacheDir string) uint64 {
	tscOnce.Do(func() {
		cache := tscCachePath(cacheDir)
		if cache != "" {
			if v := readTSCCache(cache); v >= 100000 {
				tscOnce.khz = v
				return
			}
		}
		tscOnce.khz = hostTSCkHz()
		if tscOnce.khz < 100000 {
			tscOnce.khz = 2800000
			return
		}
		if cache != "" {
			writeTSCCache(cache, tscOnce.khz)
		}
	})
	return tscOnce.khz
}

// tscCachePath is cacheDir/tsc-khz-<boot id>; "" when cacheDir is "" or
// the boot id cannot be read (the rate is then measured by each process).
func tscCachePath(cacheDir string) string {
	if cacheDir == "" {
		return ""
	}
	id, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return filepath.Join(cacheDir, "tsc-khz-"+strings.TrimSpace(string(id)))
}

func readTSCCache(p string) uint64 {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	b := make([]byte, 32)
	n, _ := f.Read(b)
	v, _ := strconv.ParseUint(strings.TrimSpace(string(b[:n])), 10, 64)
	return v
}

// writeTSCCache writes the rate to a new temporary file and renames it
// over p: a symlink planted at p is replaced, never written through.
func writeTSCCache(p string, khz uint64) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tsc-khz-*")
	if err != nil {
		return
	}
	_, err = f.WriteString(strconv.FormatUint(khz, 10))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil || os.Rename(f.Name(), p) != nil {
		os.Remove(f.Name())
	}
}

// qemuEnv is QEMU's environment: the caller's allowlisted variables
// (defaults.ChildEnv: no secret of the caller's, which code that took QEMU
// over could read) and glibc's tunables, with malloc's huge pages unless
// thp is THPNone.
func qemuEnv(thp THPMode) []string {
	env := defaults.ChildEnv("GLIBC_TUNABLES")
	if thp != THPNone {
		env = mallocHugePagesEnv(env)
	}
	return env
}

// mallocHugePagesEnv returns env with glibc's malloc told to ask for
// transparent huge pages for its heaps (glibc.malloc.hugetlb=1, glibc 2.35+;
// older ones ignore it), added to any GLIBC_TUNABLES already set. QEMU
// allocates its device state, TCG's hash tables and its I/O buffers with
// malloc: ~1.3k fewer page faults per box start, ~1 MiB more memory.
func mallocHugePagesEnv(env []string) []string {
	const tunable = "glibc.malloc.hugetlb=1"
	out := make([]string, 0, len(env)+1)
	found := false
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "GLIBC_TUNABLES="); ok {
			found = true
			if !strings.Contains(v, "glibc.malloc.hugetlb=") {
				if v != "" {
					v += ":"
				}
				e = "GLIBC_TUNABLES=" + v + tunable
			}
		}
		out = append(out, e)
	}
	if !found {
		out = append(out, "GLIBC_TUNABLES="+tunable)
	}
	return out
}

// Launch starts QEMU for c detached from the caller (in a session of its
// own; it outlives the caller) once its sockets exist, and returns its
// pid. Unless c.Jail.Off, QEMU is confined (see Jail) and is a child of
// the caller, which reaps it when it exits; otherwise QEMU daemonizes.
// Startup errors carry QEMU's own message.
func Launch(ctx context.Context, c Config) (int, error) {
	bin := c.Binary
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return 0, fmt.Errorf("%s not found: install QEMU (apt-get install qemu-system-x86) or run hack/setup.sh", bin)
	}
	if !c.Jail.Off {
		return launchJailed(ctx, path, c)
	}
	cmd := exec.CommandContext(ctx, path, c.Args()...)
	var stderr bytes.Buffer
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	if c.Secret != nil {
		sp, peer, err := secretPair(c.Secret)
		if err != nil {
			return 0, err
		}
		defer sp.Close()
		defer peer.Close()
		null, err := os.Open(os.DevNull)
		if err != nil {
			return 0, err
		}
		defer null.Close()
		cmd.ExtraFiles = []*os.File{null, sp, peer} // fd 3, fdSecret, fdSecretPeer
	}
	for _, f := range c.RAMImages { // from unconfinedFDBase on
		if f != nil {
			cmd.ExtraFiles = append(cmd.ExtraFiles, f)
		}
	}
	cmd.Env = qemuEnv(c.THP)
	start := cmd.Start
	if c.THP == THPNone {
		start = func() error { return startWithoutTHP(cmd) }
	}
	err = start()
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		// A cancelled ctx can kill the launching parent after the daemon
		// is up: do not leave that VM behind.
		if b, rerr := os.ReadFile(c.PIDFile); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && isVM(pid, c.Name) {
				vmm.Kill(vmm.Handle{PID: pid, Start: vmm.StartTime(pid)})
			}
		}
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return 0, fmt.Errorf("qemu failed to start: %s", msg)
	}
	b, err := os.ReadFile(c.PIDFile)
	if err != nil {
		return 0, fmt.Errorf("qemu started but wrote no pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("qemu pid file %s: %w", c.PIDFile, err)
	}
	return pid, nil
}

// isVM reports whether pid is a QEMU started with -name name.
func isVM(pid int, name string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.Contains(string(b), "\x00-name\x00"+name+"\x00")
}
