package netstack

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrCgoBuild means the helper was built with cgo, whose threads a Go
// program cannot change the credentials and capabilities of all at once
// (syscall.AllThreadsSyscall); build it with CGO_ENABLED=0 (hack/setup.sh
// does).
var ErrCgoBuild = errors.New("airlock-net was built with cgo and cannot give up its privileges: build it with CGO_ENABLED=0 go build ./cmd/airlock-net (hack/setup.sh does)")

// dropPrivileges makes every thread of the helper uid:gid with no
// supplementary groups, an empty bounding set, no_new_privs and no
// capability, except CAP_NET_RAW (permitted and effective, for raw ICMP
// sockets) when raw is set: the box's pings where the host allows no
// unprivileged ICMP sockets to gid (see pingAllowed). The helper calls it
// once it has bound its ports, its control socket and log and connected
// to QEMU.
func dropPrivileges(uid, gid int, raw bool) error {
	all := func(name string, trap, a1, a2, a3 uintptr) error {
		if _, _, e := syscall.AllThreadsSyscall(trap, a1, a2, a3); e != 0 {
			if e == syscall.ENOTSUP {
				return ErrCgoBuild
			}
			return fmt.Errorf("%s: %w", name, e)
		}
		return nil
	}
	// The whole bounding set: it only limits what an exec could grant, and
	// the helper never execs. CAP_NET_RAW stays permitted without it.
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if err := all("drop bounding capability", syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil {
			return err
		}
	}
	if raw {
		if err := all("keep capabilities", syscall.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 1, 0); err != nil {
			return err
		}
	}
	if err := syscall.Setgroups([]int{}); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("setgid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setuid %d: %w", uid, err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if raw {
		data[0].Permitted = 1 << unix.CAP_NET_RAW
		data[0].Effective = 1 << unix.CAP_NET_RAW
	}
	if err := all("capset", syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return err
	}
	if err := all("keep capabilities off", syscall.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 0, 0); err != nil {
		return err
	}
	return all("no_new_privs", syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0)
}

// pingGroupRange is the sysctl that says which gids may open unprivileged
// ICMP sockets ("MIN MAX"; "1 0", the default, for none).
const pingGroupRange = "/proc/sys/net/ipv4/ping_group_range"

// pingAllowed reports whether the ping_group_range sysctl's content
// (pingGroupRange) lets gid open unprivileged ICMP echo sockets.
func pingAllowed(sysctl string, gid int) bool {
	f := strings.Fields(sysctl)
	if len(f) != 2 {
		return false
	}
	lo, err1 := strconv.ParseUint(f[0], 10, 32)
	hi, err2 := strconv.ParseUint(f[1], 10, 32)
	return err1 == nil && err2 == nil && gid >= 0 && uint64(gid) >= lo && uint64(gid) <= hi
}
