package netstack

import (
	"fmt"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/seccomp"
)

// seccompAllowed are the system calls the helper makes once confined: the
// Go runtime (threads, memory, signals, timers, the poller) and the
// network (sockets on descriptors it has, new AF_INET/AF_INET6 sockets for
// the box's connections, DNS upstream and pings), and its log (writes,
// truncate and pwrite on the two descriptors OpenLog opened). Determined
// by running the network tests under strace -f; see docs/confinement.md.
var seccompAllowed = []uintptr{
	// Runtime: memory, threads, signals, time, scheduling, the cgroup
	// CPU limit it re-reads (pread64 on a descriptor it keeps).
	unix.SYS_MMAP, unix.SYS_MUNMAP, unix.SYS_MPROTECT, unix.SYS_MADVISE,
	unix.SYS_FUTEX, unix.SYS_CLONE, unix.SYS_GETTID, unix.SYS_GETPID, unix.SYS_TGKILL,
	unix.SYS_EXIT, unix.SYS_EXIT_GROUP, unix.SYS_SCHED_YIELD, unix.SYS_SCHED_GETAFFINITY,
	unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK, unix.SYS_RT_SIGRETURN, unix.SYS_SIGALTSTACK,
	unix.SYS_NANOSLEEP, unix.SYS_CLOCK_GETTIME, unix.SYS_GETTIMEOFDAY, unix.SYS_GETRANDOM,
	// A helper built with cgo starts threads with glibc's pthread_create:
	// each new thread registers its rseq area, and glibc aborts the
	// process when that fails in a process whose first thread registered
	// one (before the filter). clone3 is refused with ENOSYS below, so
	// that glibc falls back to clone.
	unix.SYS_RSEQ,
	// Descriptors it already has: the poller, reads and writes, the log
	// (LogFile rotates with ftruncate, lseek and pwrite64).
	unix.SYS_EPOLL_CREATE1, unix.SYS_EPOLL_CTL, unix.SYS_EPOLL_WAIT, unix.SYS_EPOLL_PWAIT, unix.SYS_EVENTFD2,
	unix.SYS_READ, unix.SYS_WRITE, unix.SYS_READV, unix.SYS_WRITEV, unix.SYS_PREAD64, unix.SYS_PWRITE64,
	unix.SYS_CLOSE, unix.SYS_FCNTL, unix.SYS_LSEEK, unix.SYS_FSTAT, unix.SYS_FTRUNCATE,
	// Sockets (socket itself is limited to AF_INET/AF_INET6 below): the
	// box's connections out, accepted published ports, DNS upstream,
	// pings (bind, sendto, recvfrom).
	unix.SYS_CONNECT, unix.SYS_ACCEPT4, unix.SYS_BIND, unix.SYS_SHUTDOWN,
	unix.SYS_SENDTO, unix.SYS_RECVFROM, unix.SYS_SENDMSG, unix.SYS_RECVMSG,
	unix.SYS_GETSOCKOPT, unix.SYS_SETSOCKOPT, unix.SYS_GETSOCKNAME, unix.SYS_GETPEERNAME,
}

// seccompKilled are calls that only code which took the helper over would
// make: they kill it (SECCOMP_RET_KILL_PROCESS) instead of failing.
var seccompKilled = []uintptr{
	unix.SYS_EXECVE, unix.SYS_EXECVEAT, unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT, unix.SYS_SETNS, unix.SYS_UNSHARE,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_BPF, unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_USERFAULTFD, unix.SYS_PERF_EVENT_OPEN,
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_FSOPEN, unix.SYS_FSMOUNT, unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE,
}

// seccompProgram builds the helper's filter: the allowlist, the killed
// calls, ENOSYS for clone3 (glibc's pthread_create then uses clone; with
// EPERM it fails and the Go runtime of a cgo build aborts), EPERM for
// anything else (a call a newer Go runtime makes that
// the list misses fails, as in a container, instead of killing the box's
// network), and a kill for a foreign architecture's calls.
func seccompProgram() *seccomp.Program {
	allow := map[uintptr]seccomp.SyscallRule{}
	for _, nr := range seccompAllowed {
		allow[nr] = seccomp.MatchAll{}
	}
	allow[unix.SYS_SOCKET] = seccomp.Or{
		seccomp.PerArg{seccomp.EqualTo(unix.AF_INET)},
		seccomp.PerArg{seccomp.EqualTo(unix.AF_INET6)},
	}
	kill := map[uintptr]seccomp.SyscallRule{}
	for _, nr := range seccompKilled {
		kill[nr] = seccomp.MatchAll{}
	}
	return &seccomp.Program{
		RuleSets: []seccomp.RuleSet{
			{Rules: seccomp.MakeSyscallRules(kill), Action: seccomp.KillProcess},
			{Rules: seccomp.MakeSyscallRules(allow), Action: seccomp.Allow},
			{
				Rules:  seccomp.MakeSyscallRules(map[uintptr]seccomp.SyscallRule{unix.SYS_CLONE3: seccomp.MatchAll{}}),
				Action: seccomp.ReturnError.Code(uint16(unix.ENOSYS)),
			},
		},
		Options: seccomp.ProgramOptions{
			DefaultAction: seccomp.ReturnError.Code(uint16(unix.EPERM)),
			BadArchAction: seccomp.KillProcess,
		},
	}
}

// installSeccomp installs the helper's filter on all its threads
// (SECCOMP_FILTER_FLAG_TSYNC); it sets no_new_privs first (seccomp needs
// it unless root, and the helper may run unprivileged). It is the last
// step of the helper's confinement: after it, it opens no file and starts
// no program.
func installSeccomp() error {
	instrs, _, err := seccompProgram().Build()
	if err != nil {
		return fmt.Errorf("build the seccomp filter: %w", err)
	}
	if err := seccomp.SetFilter(instrs); err != nil {
		return fmt.Errorf("install the seccomp filter: %w", err)
	}
	return nil
}
