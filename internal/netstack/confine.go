package netstack

import (
	"errors"
	"fmt"
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
// supplementary groups, no capabilities but CAP_NET_RAW (raw ICMP sockets
// for the box's pings where unprivileged ones are not allowed), an empty
// bounding set and no_new_privs. The helper calls it once it has bound its
// ports, its control socket and log and connected to QEMU.
func dropPrivileges(uid, gid int) error {
	all := func(name string, trap, a1, a2, a3 uintptr) error {
		if _, _, e := syscall.AllThreadsSyscall(trap, a1, a2, a3); e != 0 {
			if e == syscall.ENOTSUP {
				return ErrCgoBuild
			}
			return fmt.Errorf("%s: %w", name, e)
		}
		return nil
	}
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if c == unix.CAP_NET_RAW {
			continue
		}
		if err := all("drop bounding capability", syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil {
			return err
		}
	}
	if err := all("keep capabilities", syscall.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 1, 0); err != nil {
		return err
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
	data[0].Permitted = 1 << unix.CAP_NET_RAW
	data[0].Effective = 1 << unix.CAP_NET_RAW
	if err := all("capset", syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return err
	}
	return all("no_new_privs", syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0)
}
