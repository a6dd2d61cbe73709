// Package jailstage is the launcher stage of a confined program (see
// package confine and docs/confinement.md): confine.Start re-executes the
// calling program with Arg0 and Env set, and this package's init, which
// runs before the init of most of the packages of the program (this one
// imports only the standard library and x/sys/unix), builds the jail and
// execs the program (a box's QEMU). It also runs the other re-executions
// that must start lean: the console drainer of a box's QEMU, the
// confined disk tools of airlock commit, and the keeper that ends a warm
// pool's machines with their owner (Keep). Dispatching here rather than in
// a package with more dependencies saves the re-executed program most of
// the init of everything else it links (~1.5 ms per box start,
// docs/confinement.md "Cost").
package jailstage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Arg0 (as argv[0]) and Env=1 (in the environment) mark a re-execution
// of this program as the launcher stage (both must be present). Arg0
// with "-probe" (exits at once) and "-hold" (lives until its stdin
// closes) are helpers of package confine's (UserNSAllowed, IdmapUserns).
const (
	Arg0     = "airlock-qemu-jail"
	Env      = stageEnv
	stageEnv = "AIRLOCK_QEMU_JAIL_STAGE"
	// DrainArg0 (with Env=1) marks a re-execution as a console drainer:
	// argv is DrainArg0, the log's path, its cap and the uid to run as; the
	// pipe is descriptor 3 (see DrainConsole).
	DrainArg0 = "airlock-console-drain"
	// ToolArg0 (with Env=1) marks a re-execution as the launcher of a
	// program that reads a box's disk (e2fsck and debugfs, for airlock
	// commit): argv is ToolArg0, the uid (and gid) to run as, the
	// directory to work in, then the program's path and arguments (see
	// RunTool).
	ToolArg0 = "airlock-confined-tool"
	// NoSetIDArg0 (with Env=1) marks a re-execution that installs
	// NoSetIDFilter and execs argv[1] with argv[1:] and the environment
	// without the marker: how the virtio-fs daemons start (see
	// RunNoSetID).
	NoSetIDArg0 = "airlock-no-setid"
)

// Resource limits of a program RunTool starts: its address space, open
// files, core dumps, and tasks of its uid. The kernel counts threads and
// refuses the exec when the uid already has the limit's number: the
// stage's own threads (start it with GOMAXPROCS=1) take the uid with it.
const (
	ToolMaxMemory = 4 << 30
	toolMaxFiles  = 64
	toolMaxProcs  = 16
)

// DefaultConsoleMax is the default size cap of a confined box's console
// log in bytes (8 MiB).
const DefaultConsoleMax = 8 << 20

// Descriptor numbers in the stage and in the program it execs.
const (
	FDSpec = 3 // the stage's spec (a pipe)
	// FDFirst is the first descriptor the launcher passes on (the
	// caller's files, kept at their numbers across the exec: see
	// Spec.Keep; then the idmapped share mounts and the jail root, the
	// inherited files and the lease, each named by number in the spec).
	FDFirst = 4
	// FDBase is the first of the sockets and files the stage opens and
	// moves to fixed numbers: high enough never to be a descriptor the Go
	// runtime of the stage opened for itself (its epoll instance).
	FDBase = 100
)

// oldRoot is where the host's root is, in the jail, until it is detached.
const oldRoot = "/.oldroot"

// Spec is what the launcher stage does, sent as JSON on FDSpec.
type Spec struct {
	Path string   // the program, a host path (visible in the jail)
	Args []string // its arguments (without argv[0]), naming jail paths and descriptors
	Env  []string
	// Keep are descriptors of the stage the program gets at the same
	// numbers (every other one but stdio and those the stage places
	// closes at the exec).
	Keep []int
	// Root is an empty directory the stage mounts the jail's tmpfs on.
	Root string
	// Binds are host paths bound read-only into the jail at the same path
	// (directories recursively); Files are host files bound read-only at
	// another path (Src -> Dst).
	Binds []string
	Files []BindFile
	// Devices are device nodes bound at the same path.
	Devices []string
	// Listen are unix socket paths the stage binds and listens on, mode
	// 0600, as descriptors FDBase, FDBase+1, ...; Open are files it opens
	// (as descriptors after those).
	Listen []string
	// Connect are unix socket paths the stage connects to (as the
	// caller), as the descriptors after Listen's: the virtio-fs daemons'.
	Connect []string
	Open    []OpenFile
	// Inherit are descriptors of the stage (inherited from the launcher)
	// moved, in order, to the descriptors after Open's: the RAM images.
	Inherit []int
	// Proc mounts the jail's own /proc (QEMU opens its RAM images through
	// /proc/self/fd).
	Proc bool
	// Write are files the stage writes: in the jail (Path a jail path,
	// before the root is made read-only) with Root, else at host paths
	// (as the caller, before it gives up its privileges).
	Write []WriteFile
	// Shares are the 9p share directories, mounted at Dst in the jail
	// (idmapped mounts the launcher made when MountFD is set).
	Shares []ShareMount
	// UID, GID and Groups are the ids the program runs as (UID 0: the
	// stage's own, unless Userns).
	UID    int
	GID    int
	Groups []int
	// Userns says the stage runs in a user namespace its launcher made
	// that maps only the program's ids (see confine.Spec.Shares): UID,
	// GID and Groups are ids of that namespace and are set even when 0
	// (the stage's own uid is not mapped there).
	Userns bool
	// RootFD, when non-zero, is a descriptor of the stage: a detached
	// tmpfs mount the launcher made, which the stage attaches on Root
	// instead of mounting one (a tmpfs mounted in a user namespace takes
	// no file of an unmapped uid, the stage's).
	RootFD int
	// THPOff disables transparent huge pages for the program
	// (PR_SET_THP_DISABLE, inherited across the exec).
	THPOff bool
	// Lease, when non-zero, is a descriptor of the stage: the read end of
	// a pipe whose write end only the launching process holds. The stage
	// then gives the program SIGKILL as its parent-death signal, and exits
	// instead of starting it when the lease has hung up already (the
	// launcher died before the signal was set).
	Lease int
}

// BindFile is a host file bound read-only into the jail at another path.
type BindFile struct{ Src, Dst string }

// WriteFile is a file the stage writes with Data and permissions Mode
// (see Spec.Write).
type WriteFile struct {
	Path string
	Data []byte
	Mode os.FileMode
}

// ShareMount is a host directory mounted into the jail for a 9p share.
// With MountFD (a descriptor of the stage) the share is that detached
// mount, which the launcher made idmapped (confine.Start): the
// directory's owner appears as the box's uid, so the box's QEMU reads and
// writes what the owner may, and what it creates on the host belongs to
// the owner. Without it the stage binds Src.
type ShareMount struct {
	Src, Dst string
	ReadOnly bool
	MountFD  int
}

// OpenFile is a file the stage opens (as the caller, before the jail)
// with Flags (O_CLOEXEC added) and passes on as a descriptor.
type OpenFile struct {
	Path  string
	Flags int
}

func init() {
	if len(os.Args) > 0 && os.Args[0] == Arg0 && os.Getenv(stageEnv) == "1" {
		runStage()
	}
	if len(os.Args) == 4 && os.Args[0] == DrainArg0 && os.Getenv(stageEnv) == "1" {
		max, _ := strconv.ParseInt(os.Args[2], 10, 64)
		uid, _ := strconv.Atoi(os.Args[3])
		DrainConsole(os.NewFile(3, "console"), os.Args[1], max, uid)
		os.Exit(0)
	}
	if len(os.Args) == 1 && os.Args[0] == KeeperArg0 && os.Getenv(stageEnv) == "1" {
		Keep(os.NewFile(3, "lease"))
		os.Exit(0)
	}
	if len(os.Args) >= 4 && os.Args[0] == ToolArg0 && os.Getenv(stageEnv) == "1" {
		uid, err := strconv.Atoi(os.Args[1])
		if err == nil {
			err = RunTool(uid, os.Args[2], os.Args[3], os.Args[3:])
		}
		fmt.Fprintf(os.Stderr, "airlock confined tool: %v\n", err)
		os.Exit(126)
	}
	if len(os.Args) >= 2 && os.Args[0] == NoSetIDArg0 && os.Getenv(stageEnv) == "1" {
		err := RunNoSetID(os.Args[1], os.Args[1:])
		fmt.Fprintf(os.Stderr, "airlock no-setid launcher: %v\n", err)
		os.Exit(126)
	}
	if len(os.Args) > 0 && os.Args[0] == Arg0+"-probe" {
		os.Exit(0) // UserNSAllowed's probe
	}
	if len(os.Args) > 0 && os.Args[0] == Arg0+"-hold" {
		// idmapUserns's holder: lives until its stdin closes.
		b := make([]byte, 1)
		os.Stdin.Read(b)
		os.Exit(0)
	}
}

// runStage is the launcher stage: it never returns (execs the program or
// exits 1 with a message on stderr).
func runStage() {
	// no_new_privs is per thread: set it on the thread that execs.
	runtime.LockOSThread()
	if err := stage(); err != nil {
		fmt.Fprintf(os.Stderr, "airlock jail: %v\n", err)
		os.Exit(1)
	}
	os.Exit(1) // not reached
}

func stage() error {
	// Raw reads: an *os.File could bring the runtime's poller in.
	unix.SetNonblock(FDSpec, false)
	var raw []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(FDSpec, buf)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return fmt.Errorf("read spec: %w", err)
		}
		if n == 0 {
			break
		}
		raw = append(raw, buf[:n]...)
		if len(raw) > 16<<20 {
			return fmt.Errorf("read spec: too large")
		}
	}
	unix.Close(FDSpec)
	var s Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	// Sockets and files first, as the caller, with host paths.
	keep := append([]int{}, s.Keep...) // the caller's descriptors (QEMU: the secret's socket pair or /dev/null, the console pipe)
	next := FDBase
	// place makes fd the next descriptor QEMU is told about.
	place := func(fd int, err error) error {
		if err != nil {
			return err
		}
		if err := moveFD(fd, next); err != nil {
			return err
		}
		keep = append(keep, next)
		next++
		return nil
	}
	for _, p := range s.Listen {
		if err := place(listenUnix(p)); err != nil {
			return err
		}
	}
	for _, p := range s.Connect {
		if err := place(connectUnix(p)); err != nil {
			return err
		}
	}
	for _, o := range s.Open {
		fd, err := unix.Open(o.Path, o.Flags|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("open %s: %w", o.Path, err)
		}
		if err := place(fd, nil); err != nil {
			return err
		}
	}
	for _, fd := range s.Inherit {
		if err := place(fd, nil); err != nil {
			return err
		}
	}
	if s.Root != "" {
		if err := buildRoot(&s); err != nil {
			return err
		}
	} else {
		for _, w := range s.Write {
			if err := os.WriteFile(w.Path, w.Data, w.Mode); err != nil {
				return err
			}
		}
	}
	if s.THPOff {
		unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0)
	}
	if err := confine(s.UID, s.GID, s.Groups, s.Userns); err != nil {
		return err
	}
	// Every descriptor but stdio and the ones the program is told about
	// closes at exec.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close_range: %w", err)
	}
	for _, fd := range keep {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
	}
	if s.Lease > 0 {
		if err := dieWithLauncher(s.Lease, filepath.Base(s.Path)); err != nil {
			return err
		}
	}
	// Last: the program may make no setuid or setgid file (a QEMU taken
	// over owns its volumes' files through their idmapped mounts).
	if err := NoSetIDFilter(); err != nil {
		return err
	}
	err := unix.Exec(s.Path, append([]string{s.Path}, s.Args...), s.Env)
	return fmt.Errorf("exec %s: %w", s.Path, err)
}

// dieWithLauncher makes the kernel send SIGKILL to this process (the
// program, after the exec) when the thread that launched it ends; then, since
// that may have happened already, it checks the lease (a pipe only the
// launching process writes to): a hang-up means the launcher is gone, and
// the stage exits instead of starting a machine nothing owns. It must run
// after the last uid change (a credential change clears the signal) on
// the thread that execs.
func dieWithLauncher(lease int, prog string) error {
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("parent-death signal: %w", err)
	}
	fds := []unix.PollFd{{Fd: int32(lease), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("lease: %w", err)
		}
		break
	}
	if fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0 {
		return fmt.Errorf("the process that launched %s is gone", prog)
	}
	return nil
}

// Confine gives up the calling thread's privileges for good, before it
// execs: it empties the capability bounding set and sets the secure bits
// (SECBIT_NOROOT: uid 0 grants no capability at exec; no ambient
// capabilities; all locked) while it still holds CAP_SETPCAP, then, when
// uid is non-zero, takes groups, gid and uid, then empties the permitted,
// effective, inheritable and ambient sets and sets no_new_privs. It checks
// the result (an empty bounding set, no capabilities) and returns an error
// saying which step failed; nothing fails silently. In a user namespace
// (uid 0 there) the same holds within the namespace.
// The caller must have locked its OS thread: credentials and no_new_privs
// are per thread, and the thread must be the one that execs.
func Confine(uid, gid int, groups []int) error { return confine(uid, gid, groups, false) }

// confine is Confine; with setIDs it sets uid, gid and groups even when
// uid is 0 (a stage in a user namespace that maps only the program's ids,
// where uid 0 is a mapped id and the stage's own is not).
func confine(uid, gid int, groups []int, setIDs bool) error {
	const (
		secbitNoroot                  = 1 << 0
		secbitNorootLocked            = 1 << 1
		secbitKeepCapsLocked          = 1 << 5
		secbitNoCapAmbientRaise       = 1 << 6
		secbitNoCapAmbientRaiseLocked = 1 << 7
	)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	if data[0].Effective&(1<<unix.CAP_SETPCAP) == 0 {
		// An unprivileged caller without a user namespace: nothing to
		// drop, and no way to (no_new_privs keeps exec from granting any).
		if uid != 0 || setIDs || data[0].Permitted|data[1].Permitted != 0 {
			return fmt.Errorf("cannot drop capabilities: no CAP_SETPCAP (permitted %#x %#x)", data[0].Permitted, data[1].Permitted)
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
		return nil
	}
	// First the bounding set: dropping from it needs CAP_SETPCAP, which a
	// uid change from root takes away (the drops would fail after it).
	for c := 0; c < 64; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL {
			break // past the kernel's last capability
		}
		if err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, secbitNoroot|secbitNorootLocked|secbitKeepCapsLocked|
		secbitNoCapAmbientRaise|secbitNoCapAmbientRaiseLocked, 0, 0, 0); err != nil {
		return fmt.Errorf("securebits: %w", err)
	}
	if uid != 0 || setIDs {
		if groups == nil {
			groups = []int{}
		}
		if err := unix.Setgroups(groups); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if err := unix.Setresgid(gid, gid, gid); err != nil {
			return fmt.Errorf("setgid %d: %w", gid, err)
		}
		if err := unix.Setresuid(uid, uid, uid); err != nil {
			return fmt.Errorf("setuid %d: %w", uid, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data = [2]unix.CapUserData{}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	// Check: the bounding set is empty and no capability is left.
	for c := 0; c < 64; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL {
			break
		}
		if err != nil || in != 0 {
			return fmt.Errorf("capability %d is still in the bounding set (%v)", c, err)
		}
	}
	hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, d := range data {
		if d.Effective|d.Permitted|d.Inheritable != 0 {
			return fmt.Errorf("capabilities left after the drop: %+v", data)
		}
	}
	return nil
}

// RunTool runs the program bin (argv) confined, in place of the calling
// process: it changes to dir (as root, so that dir's parents need not be
// open to uid), sets resource limits (ToolMaxMemory of address space, 64
// files, no core dumps, 16 tasks of uid), gives up its privileges
// for uid (Confine: uid and gid, no groups, no capabilities, an empty
// bounding set, no_new_privs), installs a seccomp filter (toolSeccomp, on
// amd64: no sockets, ptrace, signals to others, mounts, namespaces, or
// kernel keyrings, modules, BPF, io_uring) and execs bin with an environment without
// the stage's marker. The namespaces (network, IPC, UTS, PID, mount) are
// the starter's clone flags. It returns only on an error.
func RunTool(uid int, dir, bin string, argv []string) error {
	runtime.LockOSThread()
	if uid <= 0 {
		return fmt.Errorf("uid %d: a tool runs as a uid of its own", uid)
	}
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("chdir %s: %w", dir, err)
	}
	for _, l := range []struct {
		res int
		max uint64
	}{{unix.RLIMIT_AS, ToolMaxMemory}, {unix.RLIMIT_NOFILE, toolMaxFiles}, {unix.RLIMIT_CORE, 0}, {unix.RLIMIT_NPROC, toolMaxProcs}} {
		if err := unix.Setrlimit(l.res, &unix.Rlimit{Cur: l.max, Max: l.max}); err != nil {
			return fmt.Errorf("setrlimit %d: %w", l.res, err)
		}
	}
	if err := Confine(uid, uid, []int{}); err != nil {
		return err
	}
	if err := toolSeccomp(); err != nil {
		return err
	}
	return execUnmarked(bin, argv)
}

// RunNoSetID installs NoSetIDFilter on the calling process and execs bin
// (argv) with the environment without the stage's marker: bin and every
// process it starts can make no set-user-ID or set-group-ID file. It sets
// no_new_privs unless the process may install the filter without it
// (CAP_SYS_ADMIN: root, as for the virtio-fs daemons, which may then
// still gain the privileges of what they exec). It returns only on an
// error.
func RunNoSetID(bin string, argv []string) error {
	runtime.LockOSThread()
	if err := NoSetIDFilter(); errors.Is(err, unix.EACCES) {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
		if err := NoSetIDFilter(); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	return execUnmarked(bin, argv)
}

// moveFD makes fd descriptor number to (close-on-exec) and closes fd.
func moveFD(fd, to int) error {
	if fd == to {
		return nil
	}
	if err := unix.Dup3(fd, to, unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("dup %d to %d: %w", fd, to, err)
	}
	return unix.Close(fd)
}

// listenUnix creates a listening unix socket at path that only the caller
// can connect to (mode 0600, in a directory the caller owns).
func listenUnix(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	os.Remove(path)
	// The umask makes the socket 0600 from the start: no window in which
	// another user could connect.
	old := unix.Umask(0o177)
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: path})
	unix.Umask(old)
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", path, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen %s: %w", path, err)
	}
	return fd, nil
}

// connectUnix connects to the unix socket at path.
func connectUnix(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect %s: %w", path, err)
	}
	return fd, nil
}

// buildRoot mounts the jail's root on s.Root and pivots into it.
func buildRoot(s *Spec) error {
	// Nothing mounted here propagates back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	fi, err := os.Lstat(s.Root)
	if err != nil || !fi.IsDir() {
		return fmt.Errorf("jail root %s is not a directory", s.Root)
	}
	if s.RootFD > 0 {
		if err := unix.MoveMount(s.RootFD, "", unix.AT_FDCWD, s.Root, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attach jail tmpfs on %s: %w", s.Root, err)
		}
		unix.Close(s.RootFD)
	} else if err := unix.Mount("airlock-jail", s.Root, "tmpfs", unix.MS_NOSUID, "size=1m,mode=0755"); err != nil {
		return fmt.Errorf("mount jail tmpfs on %s: %w", s.Root, err)
	}
	r := s.Root
	for _, d := range s.Binds {
		if err := bindInto(r, d, d); err != nil {
			return err
		}
	}
	for _, f := range s.Files {
		if err := bindInto(r, f.Src, f.Dst); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(r, "dev"), 0o755); err != nil {
		return err
	}
	for _, d := range s.Devices {
		if err := bindInto(r, d, d); err != nil {
			return err
		}
	}
	for _, sh := range s.Shares {
		if err := mountShare(r, sh); err != nil {
			return err
		}
	}
	if len(s.Shares) > 0 || s.Proc {
		// QEMU's 9p server sets and reads the files' extended attributes
		// through /proc/self/fd, and QEMU opens a restore's RAM images
		// there (see ramimage.go). This procfs is the jail's pid namespace's
		// (QEMU alone) and holds only its process directories (subset=pid).
		p := filepath.Join(r, "proc")
		if err := os.MkdirAll(p, 0o555); err != nil {
			return err
		}
		if err := unix.Mount("proc", p, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "subset=pid,hidepid=invisible"); err != nil {
			return fmt.Errorf("mount /proc in the jail: %w", err)
		}
	}
	for _, w := range s.Write {
		if err := os.WriteFile(filepath.Join(r, w.Path), w.Data, w.Mode); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(r, oldRoot), 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(r, filepath.Join(r, oldRoot)); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount(oldRoot, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host root: %w", err)
	}
	os.Remove(oldRoot)
	// The root itself read-only.
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("remount jail root read-only: %w", err)
	}
	return nil
}

// bindInto binds host path src read-only at dst under root. A symlink is
// copied as a symlink (e.g. /lib -> usr/lib); a missing src is skipped.
func bindInto(root, src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return nil
	}
	target := filepath.Join(root, dst)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 && src == dst {
		l, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(l, target)
	}
	st, err := os.Stat(src)
	if err != nil {
		return nil
	}
	if st.IsDir() {
		err = os.Mkdir(target, 0o755)
	} else {
		err = os.WriteFile(target, nil, 0o444)
	}
	if err != nil && !os.IsExist(err) {
		return err
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	// Remounting read-only must keep the flags the source mount has
	// (a user namespace may not clear them).
	var sf unix.Statfs_t
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID)
	if unix.Statfs(target, &sf) == nil {
		for _, m := range []struct{ st, ms uintptr }{
			{unix.ST_NODEV, unix.MS_NODEV}, {unix.ST_NOEXEC, unix.MS_NOEXEC},
			{unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
		} {
			if uintptr(sf.Flags)&m.st != 0 {
				flags |= m.ms
			}
		}
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", dst, err)
	}
	return nil
}

// mountShare mounts a 9p share's host directory at sh.Dst under root,
// read-only for a read-only share: the launcher's idmapped mount sh.MountFD
// when set, else a bind of sh.Src.
func mountShare(root string, sh ShareMount) error {
	target := filepath.Join(root, sh.Dst)
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if sh.MountFD <= 0 {
		if err := unix.Mount(sh.Src, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind volume %s: %w", sh.Src, err)
		}
		flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV)
		if sh.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		var sf unix.Statfs_t
		if unix.Statfs(target, &sf) == nil {
			for _, m := range []struct{ st, ms uintptr }{
				{unix.ST_NOEXEC, unix.MS_NOEXEC}, {unix.ST_NOATIME, unix.MS_NOATIME},
				{unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
			} {
				if uintptr(sf.Flags)&m.st != 0 {
					flags |= m.ms
				}
			}
		}
		if err := unix.Mount("", target, "", flags, ""); err != nil {
			return fmt.Errorf("remount volume %s: %w", sh.Src, err)
		}
		return nil
	}
	defer unix.Close(sh.MountFD)
	if err := unix.MoveMount(sh.MountFD, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("volume %s: move_mount: %w", sh.Src, err)
	}
	return nil
}

// DrainConsole copies r to the file path until EOF, as a ring of about
// max bytes (0: DefaultConsoleMax): when the file grows past max, its
// newest max/2 bytes move to its start and the rest is cut off (in place,
// through the one open descriptor: the drainer needs no access to the box
// directory). With uid non-zero and as root, it gives up root for uid (no
// groups, no capabilities) once the log is open.
func DrainConsole(r io.Reader, path string, max int64, uid int) {
	if max <= 0 {
		max = DefaultConsoleMax
	}
	// Not O_APPEND (rotate writes at offsets): the drainer is the file's
	// only writer and keeps its offset at the end.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		io.Copy(io.Discard, r)
		return
	}
	if uid != 0 && os.Geteuid() == 0 {
		// All threads (Go's set*id); a uid change from root clears every
		// capability. The drainer never execs.
		if syscall.Setgroups([]int{}) != nil || syscall.Setresgid(uid, uid, uid) != nil || syscall.Setresuid(uid, uid, uid) != nil {
			io.Copy(io.Discard, r)
			return
		}
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		size = 0
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			f.Write(buf[:n])
			size += int64(n)
			if size > max {
				size = rotate(f, size, max/2)
			}
		}
		if err != nil {
			f.Close()
			return
		}
	}
}

// rotate moves the last keep bytes of f (size bytes long) to its start,
// cuts it there and returns its new size.
func rotate(f *os.File, size, keep int64) int64 {
	off := size - keep
	if off <= 0 {
		return size
	}
	buf := make([]byte, 64<<10)
	var at int64
	for at < keep {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), keep-at)], off+at)
		if n > 0 {
			if _, werr := f.WriteAt(buf[:n], at); werr != nil {
				break
			}
			at += int64(n)
		}
		if err != nil {
			break
		}
	}
	if f.Truncate(at) != nil {
		return size
	}
	if _, err := f.Seek(at, io.SeekStart); err != nil {
		return size
	}
	return at
}

// execUnmarked execs bin (argv) with this process's environment less the
// stage's marker, so that bin does not run as a stage itself. It returns
// only on an error.
func execUnmarked(bin string, argv []string) error {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, stageEnv+"=") {
			env = append(env, e)
		}
	}
	return fmt.Errorf("exec %s: %w", bin, unix.Exec(bin, argv, env))
}
