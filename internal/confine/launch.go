package confine

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/confine/jailstage"
	"github.com/airlock-run/airlock/internal/defaults"
)

// The parts of a jail, as the launcher stage takes them (see
// jailstage.Spec).
type (
	// BindFile is a host file bound read-only into the jail at another
	// path.
	BindFile = jailstage.BindFile
	// ShareMount is a host directory mounted into the jail (Start idmaps
	// it to Spec.UID when the program runs as one).
	ShareMount = jailstage.ShareMount
	// OpenFile is a file the stage opens as the caller and passes on.
	OpenFile = jailstage.OpenFile
	// WriteFile is a file the stage writes into the jail.
	WriteFile = jailstage.WriteFile
)

// FDBase is the descriptor number of the first of Spec.Listen's sockets in
// the program; Connect's, Open's and Inherit's follow, in that order.
const FDBase = jailstage.FDBase

// FDFirst is the descriptor number of the first of Spec.Keep's files in
// the program.
const FDFirst = jailstage.FDFirst

// Spec says how Start confines a program (see docs/confinement.md). Start
// re-executes the calling program as the launcher stage (package
// jailstage, whose init runs it) in new mount, pid, IPC and UTS namespaces
// (and a new, empty network namespace unless HostNetwork; and, when the
// caller is not root, a user namespace that maps only the caller's uid
// and gid), as in Firecracker's jailer. The stage creates the listening
// sockets and opens the files as the caller, mounts a read-only tmpfs root
// on Root that holds only Binds, Files, Devices and Shares, pivots into
// it, changes to UID/GID when set, gives up every capability (an empty
// bounding set, no_new_privs) and execs Path. The program's own seccomp
// filter is its business (QEMU's -sandbox, in its Args).
type Spec struct {
	// Name names the program in errors ("QEMU"); StartHint, when set, is
	// added to the error of a stage that cannot start (what to do).
	Name      string
	StartHint string
	// Path is the program (a host path, which must be visible in the
	// jail: under one of Binds), Args its arguments (without argv[0]),
	// Env its whole environment.
	Path string
	Args []string
	Env  []string
	// Root is an empty directory the stage mounts the jail's root on (in
	// its own mount namespace: the host sees an empty directory), made
	// (0700) if missing. "" runs the program without namespaces and
	// without a jail: it sees the host's file system, and only the uid,
	// the capability drop and no_new_privs remain (a caller that may not
	// create user namespaces; see JailAllowed).
	Root string
	// Binds are host paths bound read-only into the jail at the same path
	// (directories recursively); Files are host files bound read-only at
	// another path; Devices are device nodes bound at the same path.
	Binds   []string
	Files   []BindFile
	Devices []string
	// Shares are host directories mounted read-write (or read-only) into
	// the jail; with UID set, idmapped: their owner appears as UID.
	Shares []ShareMount
	// Proc mounts the jail's own /proc (its pid namespace's, pids only).
	Proc bool
	// Write are files the stage writes: jail paths with Root, host paths
	// without.
	Write []WriteFile
	// Listen are unix socket paths the stage binds (mode 0600) and listens
	// on; Connect are unix sockets it connects to; Open are files it opens
	// (all as the caller, before the jail): the program's descriptors
	// FDBase, FDBase+1, ... in that order, then Inherit's files.
	Listen  []string
	Connect []string
	Open    []OpenFile
	Inherit []*os.File
	// Keep are files of the caller's the program gets as descriptors
	// FDFirst, FDFirst+1, ... (a nil entry: /dev/null, so that the
	// numbers stay fixed).
	Keep []*os.File
	// UID and GID, when UID is non-zero, are the ids the program runs as
	// (the caller must be root); Groups are its supplementary groups.
	UID, GID int
	Groups   []int
	// HostNetwork keeps the program in the caller's network namespace;
	// without it, it runs in one of its own that has only a loopback
	// device that is down.
	HostNetwork bool
	// THPOff disables transparent huge pages for the program.
	THPOff bool
	// Cgroup, when set, holds the program's limits: Go puts the stage in
	// it before the stage execs the program.
	Cgroup *Cgroup
	// Stdout and Stderr are the stage's and the program's.
	Stdout, Stderr io.Writer
	// PIDFile, when set, gets the program's pid as soon as the stage runs
	// (it execs the program: same pid), so that a start cut short leaves
	// a process that can be found.
	PIDFile string
	// DieWithCaller makes the kernel kill the program (SIGKILL) when this
	// process ends: its parent-death signal.
	DieWithCaller bool
}

// JailAllowed reports whether this process can put a program in a jail
// (Spec.Root): as root, or where it may create user namespaces.
func JailAllowed() bool { return os.Geteuid() == 0 || UserNSAllowed() == nil }

// Stage is a started launcher stage, waiting for its spec (Go).
type Stage struct {
	// Cmd is the stage's process, a child of this one; after Go it is the
	// program's. The caller waits for it (Cmd.Wait) and kills it on
	// failure.
	Cmd *exec.Cmd

	name   string
	spec   jailstage.Spec
	specW  *os.File
	cgroup *Cgroup
}

// Pid returns the stage's (and then the program's) process id.
func (st *Stage) Pid() int { return st.Cmd.Process.Pid }

// Start starts the launcher stage of the program s describes and returns
// once it runs; it waits for Go before it builds the jail. On error no
// process is left.
func Start(s Spec) (*Stage, error) {
	if s.UID != 0 && os.Geteuid() != 0 {
		return nil, fmt.Errorf("confinement: running %s as uid %d needs root", s.Name, s.UID)
	}
	spec, extra, closers, err := stageSpec(s)
	defer func() {
		for _, f := range closers {
			f.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	// A socket of an earlier start would make bind fail.
	for _, p := range spec.Listen {
		os.Remove(p)
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer specR.Close()
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       []string{jailstage.Arg0},
		Env:        StageEnv(),
		Stdout:     s.Stdout,
		Stderr:     s.Stderr,
		ExtraFiles: append([]*os.File{specR}, extra...),
		SysProcAttr: &syscall.SysProcAttr{
			Setsid:     true,
			Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
		},
	}
	if !s.HostNetwork {
		cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWNET
	}
	if spec.Root == "" {
		cmd.SysProcAttr.Cloneflags = 0
	} else if os.Geteuid() != 0 {
		cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWUSER
		// uid 0 in the namespace (the caller's uid outside): the stage
		// keeps the namespace's capabilities across its exec to build
		// the jail, then drops them all before the program (see
		// jailstage.Confine).
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		cmd.SysProcAttr.GidMappingsEnableSetgroups = false
		spec.Groups = nil
	}
	if s.DieWithCaller {
		// The stage's parent-death signal follows the thread that
		// started it: one that never ends.
		err = onLaunchThread(cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		specW.Close()
		if s.StartHint != "" {
			return nil, fmt.Errorf("start the %s launcher: %w (%s)", s.Name, err, s.StartHint)
		}
		return nil, fmt.Errorf("start the %s launcher: %w", s.Name, err)
	}
	if s.PIDFile != "" {
		os.WriteFile(s.PIDFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
	}
	return &Stage{Cmd: cmd, name: s.Name, spec: spec, specW: specW, cgroup: s.Cgroup}, nil
}

// stageSpec returns the launcher stage's spec for s and the files the
// stage gets as descriptors FDFirst, FDFirst+1, ... (extra); closers are
// the files it opened for them, which the caller closes once the stage
// runs (also on error).
func stageSpec(s Spec) (spec jailstage.Spec, extra, closers []*os.File, err error) {
	spec = jailstage.Spec{
		Path: s.Path, Args: s.Args, Env: s.Env, Root: s.Root,
		Binds: s.Binds, Files: s.Files, Devices: s.Devices, Shares: append([]ShareMount(nil), s.Shares...),
		Proc: s.Proc, Write: s.Write, Listen: s.Listen, Connect: s.Connect, Open: s.Open,
		UID: s.UID, GID: s.GID, Groups: s.Groups, THPOff: s.THPOff,
	}
	if spec.Root != "" {
		if err := os.MkdirAll(spec.Root, 0o700); err != nil {
			return spec, extra, closers, fmt.Errorf("jail root: %w", err)
		}
		if spec.Groups == nil {
			spec.Groups = []int{}
		}
	}
	if s.UID != 0 {
		// The program opens these itself (a QEMU's -kernel takes no
		// descriptor), as another uid: they must be readable by all.
		for _, f := range spec.Files {
			if err := worldReadable(f.Src, s.Name); err != nil {
				return spec, extra, closers, err
			}
		}
	}
	// The caller's files first, /dev/null for a nil one.
	for i, f := range s.Keep {
		if f == nil {
			null, err := os.Open(os.DevNull)
			if err != nil {
				return spec, extra, closers, err
			}
			closers = append(closers, null)
			f = null
		}
		extra = append(extra, f)
		spec.Keep = append(spec.Keep, FDFirst+i)
	}
	next := func() int { return FDFirst + len(extra) }
	// Shares of a program that runs as a uid of its own are idmapped: the
	// directory's owner appears as that uid in the jail.
	if spec.Root != "" && s.UID != 0 {
		byOwner := map[[2]int]int{}
		for i := range spec.Shares {
			fi, err := os.Stat(spec.Shares[i].Src)
			if err != nil {
				return spec, extra, closers, fmt.Errorf("volume %s: %w", spec.Shares[i].Src, err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			owner := [2]int{int(st.Uid), int(st.Gid)}
			fd, ok := byOwner[owner]
			if !ok {
				f, err := IdmapUserns(owner[0], owner[1], s.UID, s.GID)
				if err != nil {
					return spec, extra, closers, fmt.Errorf("volume %s: %w", spec.Shares[i].Src, err)
				}
				closers = append(closers, f)
				fd = next()
				extra = append(extra, f)
				byOwner[owner] = fd
			}
			spec.Shares[i].UsernsFD = fd
		}
	}
	for _, f := range s.Inherit {
		spec.Inherit = append(spec.Inherit, next())
		extra = append(extra, f)
	}
	if s.DieWithCaller {
		l, err := lease()
		if err != nil {
			return spec, extra, closers, err
		}
		spec.Lease = next()
		extra = append(extra, l)
	}
	return spec, extra, closers, nil
}

// Go puts the stage in its cgroup (Spec.Cgroup) and sends it its spec:
// the stage then builds the jail and execs the program. On error the
// caller kills the stage (Cmd.Process.Kill).
func (st *Stage) Go() error {
	defer st.specW.Close()
	if g := st.cgroup; g != nil {
		if err := g.Add(st.Pid()); err != nil {
			return err
		}
	}
	if err := json.NewEncoder(st.specW).Encode(&st.spec); err != nil {
		return fmt.Errorf("send the %s launcher its spec: %w", st.name, err)
	}
	return nil
}

// StageEnv is the environment of a re-execution of this program as the
// launcher stage: the allowlisted variables (defaults.ChildEnv), the Go
// runtime's settings and the marker that makes the program a stage. The
// stage runs as root until it execs the program with the spec's
// environment; neither holds a secret of the caller's.
func StageEnv() []string {
	return append(defaults.ChildEnv(defaults.GoRuntimeEnv...), jailstage.Env+"=1")
}

// lease returns the read end of a pipe whose write end this process
// holds open until it ends (made once): a stage that gets it sees it hang
// up only once this process is gone (see jailstage.Spec.Lease).
var lease = sync.OnceValues(func() (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("QEMU lease pipe: %w", err)
	}
	leaseW = w
	return r, nil
})

// leaseW is lease's write end, never closed.
var leaseW *os.File

// launchThread runs the functions sent to it on one OS thread that never
// ends (a goroutine locked to it that never returns). A process's
// parent-death signal is sent when the thread that forked it ends, and
// the Go runtime may end other threads (one whose locked goroutine
// returned).
var launchThread = sync.OnceValue(func() chan<- func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread()
		for f := range ch {
			f()
		}
	}()
	return ch
})

// onLaunchThread runs f on launchThread and returns its error.
func onLaunchThread(f func() error) error {
	done := make(chan error, 1)
	launchThread() <- func() { done <- f() }
	return <-done
}

// IdmapUserns returns a user namespace (its /proc/PID/ns/user, open) that
// maps only uid and gid inside to boxUID and boxGID outside: a mount
// idmapped through it shows the files of uid:gid as boxUID:boxGID's, and
// files boxUID creates there belong to uid:gid on disk.
func IdmapUserns(uid, gid, boxUID, boxGID int) (*os.File, error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{jailstage.Arg0 + "-hold"}
	cmd.Env = defaults.ChildEnv(defaults.GoRuntimeEnv...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 unix.CLONE_NEWUSER,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: uid, HostID: boxUID, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: gid, HostID: boxGID, Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("user namespace for an idmapped mount: %w", err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	f, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("user namespace for an idmapped mount: %w", err)
	}
	return f, nil
}

// worldReadable makes file readable by every uid, if it is not.
func worldReadable(file, name string) error {
	fi, err := os.Stat(file)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return nil
	}
	if err := os.Chmod(file, fi.Mode().Perm()|0o444); err != nil {
		return fmt.Errorf("%s must be readable by the box's %s uid: %w (chmod a+r it)", file, name, err)
	}
	return nil
}

// UserNSAllowed returns nil if this process may create a user namespace
// (with mount, pid and network namespaces in it), else why not.
func UserNSAllowed() error {
	userNSOnce.Do(func() {
		if os.Geteuid() == 0 {
			return
		}
		cmd := exec.Command("/proc/self/exe")
		cmd.Args = []string{jailstage.Arg0 + "-probe"}
		cmd.Env = defaults.ChildEnv(defaults.GoRuntimeEnv...)
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: os.Getuid(), HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: os.Getgid(), HostID: os.Getgid(), Size: 1}},
		}
		if err := cmd.Start(); err != nil {
			userNSErr = fmt.Errorf("cannot create a user namespace: %w (kernel.unprivileged_userns_clone, user.max_user_namespaces or an AppArmor/SELinux policy forbids it)", err)
			return
		}
		cmd.Process.Kill()
		cmd.Wait()
	})
	return userNSErr
}

var (
	userNSOnce sync.Once
	userNSErr  error
)

// ToolCmd makes cmd (its Path, Args and Dir set, as exec.Command makes
// them) run confined as a program that reads a hostile disk (e2fsck and
// debugfs for airlock commit): through a re-execution of this program
// (jailstage.RunTool) that changes to cmd.Dir as root, sets resource
// limits, gives up its privileges for uid (which must own what the tool
// writes), installs the tools' seccomp filter and execs the tool, in new
// network (empty), IPC, UTS, PID and mount namespaces. Its environment is
// the allowlisted one (defaults.ChildEnv). As root only.
func ToolCmd(cmd *exec.Cmd, uid int) {
	bin := cmd.Path
	cmd.Args = append([]string{jailstage.ToolArg0, strconv.Itoa(uid), cmd.Dir, bin}, cmd.Args[1:]...)
	cmd.Path = "/proc/self/exe"
	cmd.Dir = ""
	// One P: the stage's threads count against the tool's task limit.
	cmd.Env = append(defaults.ChildEnv(), "GOMAXPROCS=1", jailstage.Env+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
	}
}
