package jailstage

import "golang.org/x/sys/unix"

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
		jeqK = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		retK = unix.BPF_RET | unix.BPF_K
	)
	n := len(toolDenied)
	prog := archCheck()
	for i, nr := range toolDenied {
		prog = append(prog, unix.SockFilter{Code: jeqK, Jt: uint8(n - i), Jf: 0, K: nr})
	}
	prog = append(prog, unix.SockFilter{Code: retK, K: seccompRetAllow}, unix.SockFilter{Code: retK, K: seccompRetErrno | uint32(unix.EPERM)})
	return installFilter(prog)
}
