// Package vmm is the seam between a box and the machine it runs in, in the
// spirit of lima's pkg/driver: the lifecycle code in package airlock asks a
// Driver to prepare a box directory and to start a Machine from a Spec; it
// re-attaches to a machine another process started through the Handle kept
// in the box record, dials the guest agent through it, and watches it die.
//
// Two drivers implement it: qemu (internal/vmm/qemu), which boots microVMs,
// and fake (internal/vmm/fake), which runs the real guest agent as a host
// process, for lifecycle tests that need no VM. Abilities that only some
// drivers have are separate small interfaces (BootReporter, Snapshotter,
// Pauser), tested for with a type assertion; a driver without one returns
// ErrNotSupported where the caller needs it. The conformance suite
// internal/vmm/vmmtest holds each driver to this contract.
//
// A box's life, as the lifecycle code drives it:
//
//	d.Create(ctx, spec)         // once, with spec.Disks made (DiskBooter)
//	m, _ := d.Start(ctx, spec)  // each boot: the machine runs, agent not yet up
//	c, _ := m.DialAgent(ctx)    // as often as needed, from any process
//	<-m.Exited(); m.Death()     // unexpected end: why, with the console's tail
//	m.Quit(ctx); m.Kill()       // the agent's Shutdown did not end it in time
//	m.Release()                 // once it has ended: what the boot held (cgroup)
package vmm

import (
	"context"
	"errors"

	"github.com/airlock-run/airlock/internal/agent/client"
)

// ErrNotSupported is returned for an ability the driver lacks.
var ErrNotSupported = errors.New("not supported by this VM driver")

// Spec is what a machine is made from: the box's settings and its
// directory. It is built anew for every call from the box record.
type Spec struct {
	ID  string // box id
	Dir string // box directory; the driver keeps its files there (see boxdir)

	CPUs        int // vCPUs
	MemoryMiB   int // guest RAM
	DiskSizeMiB int // writable layer size
	// Net is the guest's network interface; nil: it has none.
	Net      *NetSpec
	Hostname string // the guest's hostname

	// Disks are the files of the root filesystem, which the lifecycle
	// code prepares for a driver that boots from disks (DiskBooter); zero
	// for other drivers.
	Disks Disks

	// Volumes are attached in order: host directories shared with the
	// guest and named-volume disk images.
	Volumes []Volume

	// ExtraCmdline is added to the guest kernel's command line (the boot
	// benchmark's AIRLOCK_BARE=1).
	ExtraCmdline []string

	// DieWithCaller ends the machine (SIGKILL) when the process that
	// starts it ends, whether it exits or is killed: an AutoRemove box's
	// record goes with its owner, and no machine may run that no record
	// lists. Drivers that cannot do it ignore it (the QEMU driver does it
	// for a confined QEMU).
	DieWithCaller bool
}

// Disks name the prepared files a machine's root filesystem is made of.
// The lifecycle code builds them (internal/rootfs) above the seam: the
// driver is handed paths and never sees the image store.
type Disks struct {
	// Base is the root filesystem base of the box's image: an erofs image,
	// read only, shared by every box of that image (in the cache
	// directory). Set for Create, Start, SaveSnapshot, CreateFromSnapshot
	// and StartFromSnapshot; the file exists.
	Base string
	// Layer is the box's writable layer: a sparse ext4 image of
	// Spec.DiskSizeMiB MiB in the box directory (boxdir.RW), which the
	// guest joins over the base with overlayfs. Create and Start find it
	// made; CreateFromSnapshot makes it, a copy of the snapshot's.
	Layer string
}

// DiskBooter is a driver whose machines boot from disk files: for it the
// lifecycle code fills Spec.Disks, building the base (cached per image)
// and, for a new box, an empty writable layer. A driver without it (the
// fake, whose agent runs on the host's own filesystem) gets no Disks.
type DiskBooter interface {
	// BootsFromDisks reports whether the driver's machines need
	// Spec.Disks.
	BootsFromDisks() bool
}

// Volume is storage attached to a machine and mounted by the guest agent
// at Target. Exactly one of HostDir and Disk is set.
type Volume struct {
	// HostDir is a host directory shared with the guest (QEMU: virtio-9p,
	// or virtio-fs with its VolumeTransport option); ReadOnly is enforced
	// on the host side.
	HostDir string
	// Disk is a disk image with an ext4 filesystem (a named volume).
	Disk     string
	Target   string // mount point in the box
	ReadOnly bool
}

// NetSpec is a machine's network interface: a NIC whose Ethernet frames
// go over a unix stream socket to a user-mode network stack on the host
// (airlock's network helper, cmd/airlock-net, which the lifecycle code
// starts and stops with the machine and which enforces the box's network
// policy). The driver only carries frames; it knows nothing of the policy.
// A driver that cannot give a machine a NIC returns ErrNotSupported from
// Create and Start for a Spec with one.
type NetSpec struct {
	// Socket is the unix socket the machine listens on for the network
	// stack to connect to (QEMU: -netdev stream, server=on); frames go as a
	// 4-byte big-endian length and the frame. The NIC has no link until
	// the stack connects. "" gives the driver's own user-mode network
	// instead (QEMU's slirp, which reaches the host's loopback): only the
	// network benchmark compares against it.
	Socket string
	// MTU, when non-zero, is the MTU the NIC advertises to the guest
	// (virtio-net host_mtu), which the guest's driver adopts.
	MTU int
}

// Handle identifies a running machine across processes: the pid of the
// process that runs it (QEMU, the fake's agent) and that process's start
// time, which tells it apart from a later process with the same pid. The
// box record keeps it.
type Handle struct {
	PID   int
	Start uint64
}

// Driver starts and finds machines. Methods are safe for concurrent use.
type Driver interface {
	// Name is the driver's name ("qemu", "fake").
	Name() string
	// Create prepares a new box's directory (spec.Dir exists, and
	// spec.Disks for a DiskBooter): whatever outlives one boot.
	Create(ctx context.Context, spec Spec) error
	// Start boots a machine for spec and returns once its process runs;
	// the guest agent may not answer yet (DialAgent waits within ctx).
	// Files a previous boot left in spec.Dir are replaced.
	Start(ctx context.Context, spec Spec) (Machine, error)
	// Attach returns the machine h recorded for spec's box; it may have
	// ended since (see Machine.Alive).
	Attach(spec Spec, h Handle) Machine
}

// Machine is one boot of a box. Several processes may hold a Machine for
// the same boot (Attach). Methods are safe for concurrent use.
type Machine interface {
	Handle() Handle
	// Alive reports whether the machine's process still runs.
	Alive() bool
	// Exited returns a channel closed when the machine's process has
	// ended (watched from this process; any process may watch).
	Exited() <-chan struct{}
	// DialAgent connects to the guest agent and runs the handshake. Each
	// call is a new connection; ctx bounds the wait for a free channel
	// and the handshake.
	DialAgent(ctx context.Context) (*client.Client, error)
	// Death says why a machine that has ended did so, from what it left
	// (its console); call it after Exited is closed or Alive is false.
	Death() Death
	// Quit asks the machine to end at once without the guest's
	// cooperation (QEMU: QMP quit) and returns when that was sent or ctx
	// ended; the caller then waits for Alive to turn false.
	Quit(ctx context.Context) error
	// Kill ends the machine's process (SIGKILL), waits for it to go and
	// releases what the boot held (see Release).
	Kill() error
	// Release frees what the boot holds on the host outside its process
	// (QEMU: its cgroup) once the process has ended; while it runs,
	// Release does nothing. Safe to call more than once, from any process.
	Release()
	// Console returns the last n lines of the console of this boot.
	Console(n int) string
}

// Death is why a machine ended, in words, with the end of its console.
type Death struct {
	Cause       string // "guest kernel panic (...)", "its QEMU process (pid 7) exited unexpectedly"
	ConsoleTail string
}

// StrayKiller is a driver that can find a machine of a box that no record
// names: one whose start was cut short (its process killed) between the
// launch and the record of its handle. Removing a box kills it before the
// box's record goes, so that no machine runs that no record lists.
type StrayKiller interface {
	// KillStray kills the machine of spec's box that still runs, if any,
	// and waits for it to go. The caller holds the box's lock (no start
	// of the box is under way).
	KillStray(spec Spec) error
}

// UsageReporter is a driver that can count the machines of its kind that
// run on this host, of every airlock home and user (for host-wide
// capacity caps).
type UsageReporter interface {
	// Usage counts the running machines other than box except's.
	Usage(except string) Usage
}

// Usage is what the running machines of a driver take.
type Usage struct {
	Machines  int
	MemoryMiB int // guest memory, in total
}

// BootReporter is a driver that can say what its machines boot with.
type BootReporter interface {
	BootInfo() (BootInfo, error)
}

// BootInfo describes what a driver's machines boot with (see airlock.BootInfo).
type BootInfo struct {
	Accel, AccelReason string // "kvm" or "tcg"; why not KVM
	Kernel             string // path of the guest kernel
	KernelKind         string // "airlock", "debian" or "custom"
	KernelVer          string
	KernelConfigHash   string
	Initrd, AgentDisk  string // the one the kernel boots with
	THP                string // "on", "code" or "off"
	// Warnings are what the user should hear once a machine has booted,
	// one line each, plain text: software emulation that was not asked
	// for, a fallback kernel. The lifecycle code sends them after a
	// successful start, never on a failed one.
	Warnings []string
}

// BootWarnings are what a driver that reports its boots (BootReporter)
// says the user should hear once a box has booted (TCG that was not
// asked for, a fallback kernel); none for another driver or when it
// cannot say.
func BootWarnings(d Driver) []string {
	br, ok := d.(BootReporter)
	if !ok {
		return nil
	}
	b, err := br.BootInfo()
	if err != nil {
		return nil
	}
	return b.Warnings
}
