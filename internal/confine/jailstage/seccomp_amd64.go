package jailstage

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// toolDenied are the system calls a program RunTool starts gets EPERM
// for: none of them is needed to read a disk image and write files, and
// each is a way out for code that took the program over (the network,
// other processes, mounts and namespaces, the kernel's more exposed
// interfaces). execve stays allowed: the filter is installed before the
// tool's own exec.
var toolDenied = []uint32{
	unix.SYS_SOCKET, unix.SYS_SOCKETPAIR, unix.SYS_CONNECT, unix.SYS_BIND, unix.SYS_LISTEN, unix.SYS_ACCEPT, unix.SYS_ACCEPT4,
	unix.SYS_SENDTO, unix.SYS_SENDMSG, unix.SYS_SENDMMSG,
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_PIDFD_GETFD, unix.SYS_KILL, unix.SYS_TKILL,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT, unix.SYS_SETNS, unix.SYS_UNSHARE,
	unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_BPF, unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_USERFAULTFD, unix.SYS_PERF_EVENT_OPEN,
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT, unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_EXECVEAT, unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_REBOOT, unix.SYS_ACCT,
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_ADJTIMEX, unix.SYS_CLOCK_ADJTIME, unix.SYS_QUOTACTL, unix.SYS_LOOKUP_DCOOKIE,
}

// toolSeccomp installs RunTool's seccomp filter on the calling thread
// (no_new_privs must be set): system calls of another architecture (and
// x32's) kill the process, toolDenied's fail with EPERM, the rest are
// allowed.
func toolSeccomp() error {
	const (
		archX8664  = 0xc000003e // AUDIT_ARCH_X86_64
		x32Bit     = 0x40000000
		retKill    = 0x80000000 // SECCOMP_RET_KILL_PROCESS
		retErrno   = 0x00050000
		retAllow   = 0x7fff0000
		offNr      = 0 // struct seccomp_data
		offArch    = 4
		ldAbsW     = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK       = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jsetK      = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		retK       = unix.BPF_RET | unix.BPF_K
		seccompSet = 1 // SECCOMP_SET_MODE_FILTER
	)
	n := len(toolDenied)
	prog := []unix.SockFilter{
		{Code: ldAbsW, K: offArch},
		{Code: jeqK, Jt: 1, Jf: 0, K: archX8664},
		{Code: retK, K: retKill},
		{Code: ldAbsW, K: offNr},
		{Code: jsetK, Jt: 0, Jf: 1, K: x32Bit},
		{Code: retK, K: retKill},
	}
	for i, nr := range toolDenied {
		prog = append(prog, unix.SockFilter{Code: jeqK, Jt: uint8(n - i), Jf: 0, K: nr})
	}
	prog = append(prog, unix.SockFilter{Code: retK, K: retAllow}, unix.SockFilter{Code: retK, K: retErrno | uint32(unix.EPERM)})
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, seccompSet, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("seccomp filter: %w", e)
	}
	return nil
}
