package jailstage

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setIDModeBits are the mode bits a confined program may not give a
// file: set-user-ID and set-group-ID.
const setIDModeBits = unix.S_ISUID | unix.S_ISGID

// setIDCreateFlags are the open flags with which open and openat use
// their mode argument: O_CREAT, and O_TMPFILE's own bit (__O_TMPFILE; an
// unnamed file that linkat can give a name later).
const setIDCreateFlags = unix.O_CREAT | (unix.O_TMPFILE &^ unix.O_DIRECTORY)

// setIDModeArg says which argument (0-based) of a system call is a mode
// that may not carry setIDModeBits, and flags, when not -1, the argument
// holding open flags: the mode counts only when one of setIDCreateFlags
// is set (without them the kernel ignores it).
type setIDModeArg struct {
	nr          uint32
	mode, flags int
}

// setIDModeCalls are the system calls that set a file's mode from an
// argument: each fails with EPERM when that mode has S_ISUID or S_ISGID.
var setIDModeCalls = []setIDModeArg{
	{unix.SYS_CHMOD, 1, -1},
	{unix.SYS_FCHMOD, 1, -1},
	{unix.SYS_FCHMODAT, 2, -1},
	{unix.SYS_FCHMODAT2, 2, -1},
	{unix.SYS_CREAT, 1, -1},
	{unix.SYS_OPEN, 2, 1},
	{unix.SYS_OPENAT, 3, 2},
	{unix.SYS_MKNOD, 1, -1},
	{unix.SYS_MKNODAT, 2, -1},
	{unix.SYS_MKDIR, 1, -1},
	{unix.SYS_MKDIRAT, 2, -1},
}

// setIDNoSys are the system calls that fail with ENOSYS: openat2, whose
// mode lies in a struct the filter cannot read (glibc and QEMU fall back
// to openat), and io_uring, whose operations (IORING_OP_OPENAT,
// IORING_OP_MKDIRAT...) the kernel runs without seccomp seeing them
// (QEMU then polls with epoll and does its I/O with threads, as it does
// unless told aio=io_uring, which airlock never does).
var setIDNoSys = []uint32{unix.SYS_OPENAT2, unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER}

// NoSetIDFilter installs, on the calling thread, the seccomp filter that
// keeps a program from making set-user-ID or set-group-ID files (see
// docs/confinement.md "No setuid files"): chmod, fchmod, fchmodat,
// fchmodat2, creat, mknod(at), mkdir(at), and open(at) with O_CREAT or
// O_TMPFILE fail with EPERM when their mode has S_ISUID or S_ISGID;
// openat2 and io_uring fail with ENOSYS; system calls of another
// architecture (and x32's) kill the process; everything else is allowed
// (a program's own filter, installed later, still applies). The filter is
// inherited across fork and exec. The thread needs no_new_privs or
// CAP_SYS_ADMIN.
func NoSetIDFilter() error { return installFilter(noSetIDProg()) }

// noSetIDProg is NoSetIDFilter's BPF program.
func noSetIDProg() []unix.SockFilter {
	const (
		ldAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		retK   = unix.BPF_RET | unix.BPF_K
	)
	// arg is the offset of the low 32 bits of argument i in struct
	// seccomp_data (little endian): modes are umode_t and flags int, so
	// the kernel reads only those.
	arg := func(i int) uint32 { return uint32(16 + 8*i) }
	prog := archCheck()
	// One block per call: "not this call: skip the block", then the
	// checks, ending in EPERM (a match) or ALLOW.
	for _, c := range setIDModeCalls {
		var block []unix.SockFilter
		if c.flags >= 0 {
			block = append(block,
				unix.SockFilter{Code: ldAbsW, K: arg(c.flags)},
				unix.SockFilter{Code: jsetK, Jt: 1, Jf: 0, K: setIDCreateFlags},
				unix.SockFilter{Code: retK, K: seccompRetAllow})
		}
		block = append(block,
			unix.SockFilter{Code: ldAbsW, K: arg(c.mode)},
			unix.SockFilter{Code: jsetK, Jt: 0, Jf: 1, K: setIDModeBits},
			unix.SockFilter{Code: retK, K: seccompRetErrno | uint32(unix.EPERM)},
			unix.SockFilter{Code: retK, K: seccompRetAllow})
		prog = append(prog, unix.SockFilter{Code: jeqK, Jt: 0, Jf: uint8(len(block)), K: c.nr})
		prog = append(prog, block...)
		// The next call's number check needs the number back in A.
		prog = append(prog, unix.SockFilter{Code: ldAbsW, K: seccompOffNr})
	}
	for _, nr := range setIDNoSys {
		prog = append(prog,
			unix.SockFilter{Code: jeqK, Jt: 0, Jf: 1, K: nr},
			unix.SockFilter{Code: retK, K: seccompRetErrno | uint32(unix.ENOSYS)})
	}
	return append(prog, unix.SockFilter{Code: retK, K: seccompRetAllow})
}

// seccomp's constants (linux/seccomp.h, linux/audit.h).
const (
	seccompRetKill  = 0x80000000 // SECCOMP_RET_KILL_PROCESS
	seccompRetErrno = 0x00050000
	seccompRetAllow = 0x7fff0000
	seccompOffNr    = 0 // struct seccomp_data
	seccompOffArch  = 4
	auditArchX8664  = 0xc000003e
	x32SyscallBit   = 0x40000000
)

// archCheck is the start of a filter: a system call of another
// architecture or of x32 kills the process (their numbers differ, so the
// rest of the filter would not recognise them); it leaves the call's
// number in A.
func archCheck() []unix.SockFilter {
	const (
		ldAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		retK   = unix.BPF_RET | unix.BPF_K
	)
	return []unix.SockFilter{
		{Code: ldAbsW, K: seccompOffArch},
		{Code: jeqK, Jt: 1, Jf: 0, K: auditArchX8664},
		{Code: retK, K: seccompRetKill},
		{Code: ldAbsW, K: seccompOffNr},
		{Code: jsetK, Jt: 0, Jf: 1, K: x32SyscallBit},
		{Code: retK, K: seccompRetKill},
	}
}

// installFilter installs prog as a seccomp filter of the calling thread.
func installFilter(prog []unix.SockFilter) error {
	const seccompSetModeFilter = 1
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, seccompSetModeFilter, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("seccomp filter: %w", e)
	}
	return nil
}
