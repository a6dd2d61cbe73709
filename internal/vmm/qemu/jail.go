package qemu

import (
	"strings"

	"github.com/airlock-run/airlock/internal/confine"
)

// Jail says how Launch confines QEMU (see docs/confinement.md). The zero
// value confines it as far as the caller's privileges allow.
//
// A confined QEMU is started by confine.Start's launcher stage (this
// program, re-executed from /proc/self/exe, see package
// internal/confine/jailstage) in new mount, pid, IPC and UTS namespaces
// (and a new, empty network namespace unless HostNetwork), as in
// Firecracker's jailer. The stage creates the listening sockets and opens
// the disks and the console log as the caller, pivots into a read-only
// tmpfs root that holds only the system's library directories, the kernel
// and initramfs and a few device nodes, changes to UID/GID when set, sets
// no_new_privs and execs QEMU with
// -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny.
// QEMU then gets its sockets and files as inherited descriptors and can
// open no host path but those assets. A migration blocker (an empty qcow
// v1 drive) makes every `migrate`, the monitor's way to run a command
// (exec: URIs), fail before anything is spawned; any other attempt to
// fork or exec kills QEMU (SIGSYS).
type Jail struct {
	// Off starts QEMU as before confinement: -daemonize, the caller's
	// uid, no namespaces, no seccomp filter (AIRLOCK_CONFINE=off; for
	// benchmarks and debugging).
	Off bool
	// UID and GID, when UID is non-zero and the caller is root, are the
	// ids QEMU runs as; Groups are its supplementary groups (the kvm group
	// under KVM).
	UID, GID int
	Groups   []int
	// HostNetwork keeps QEMU in the caller's network namespace: QEMU's
	// user-mode networking (slirp) opens host sockets. Without it QEMU
	// runs in a network namespace of its own that has only a loopback
	// device that is down; a network backend that reaches the host over a
	// unix socket (a stream netdev passed as a descriptor) works there.
	HostNetwork bool
	// UserNS runs the stage in a new user namespace that maps only the
	// caller's uid and gid (how an unprivileged caller gets mount, pid and
	// network namespaces). Set by Launch when the caller is not root and
	// user namespaces are allowed (see Protections).
	UserNS bool
	// Cgroup, when set, holds QEMU's limits; Launch puts QEMU in it
	// before QEMU runs.
	Cgroup *confine.Cgroup
	// NoSeccomp and NoPivot are TEST-ONLY (JailOptions.TestWithout): no
	// -sandbox filter; no namespaces and no jail root.
	NoSeccomp, NoPivot bool
	// DieWithCaller makes the kernel kill QEMU (SIGKILL) when the process
	// that launched it ends (vmm.Spec.DieWithCaller): the stage sets
	// QEMU's parent-death signal.
	DieWithCaller bool
}

// SandboxArg is QEMU's seccomp filter for a confined QEMU.
const SandboxArg = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// QEMU's descriptors (confine.Spec.Keep, and the same numbers for an
// unconfined QEMU): the agent secret port's socket (Config.Secret), the
// other end of its socket pair, held open (see secretPair), and the write
// end of the console drainer's pipe.
const (
	fdSecret     = confine.FDFirst
	fdSecretPeer = confine.FDFirst + 1
	fdConsole    = confine.FDFirst + 2
	// fdBase is the first of the sockets and files the stage opens
	// (confine.Spec.Listen, Connect, Open, Inherit).
	fdBase = confine.FDBase
)

// Paths inside QEMU's jail.
const (
	jailKernel = "/boot/kernel"
	jailInitrd = "/boot/initrd"
	jailNoMig  = "/nomigrate.qcow"
	jailShares = "/shares" // the 9p shares' directories, by share ID
)

// noMigrateQcow returns an empty qcow (version 1) image of 512 bytes.
// QEMU registers a migration blocker for every open qcow v1 node, so with
// one attached (read-only, to no device) `migrate` fails before it opens
// its URI: `migrate exec:CMD` cannot run CMD.
func noMigrateQcow() []byte {
	b := make([]byte, 560)
	copy(b, "QFI\xfb")
	b[7] = 1                 // version 1
	b[0x1e] = 0x02           // size 512 (big-endian u64 at 0x18)
	b[0x20], b[0x21] = 12, 9 // cluster_bits, l2_bits
	b[0x2f] = 0x30           // l1_table_offset
	return b
}

// NoMigrateNode is the block node name of the migration blocker (see
// noMigrateQcow). Snapshots (SaveSnapshot) delete the node for the time
// of their own migrate fd: and add it again afterwards.
const NoMigrateNode = "airlock-nomigrate"

// noMigrateBlockdev is the -blockdev (or blockdev-add) value of the
// migration blocker image at path (as QEMU sees it).
func noMigrateBlockdev(path string) string {
	return "driver=qcow,node-name=" + NoMigrateNode + ",read-only=on,file.driver=file,file.filename=" + escapeComma(path)
}

// systemDirs are bound read-only into the jail (those that exist): QEMU,
// its shared libraries, modules and firmware.
var systemDirs = []string{"/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc/ld.so.cache"}

// inJail reports whether p lies under one of the system directories bound
// into the jail.
func inJail(p string) bool {
	for _, d := range systemDirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}
