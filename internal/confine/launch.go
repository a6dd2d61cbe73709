package confine

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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
// bounding set, no_new_privs), installs the seccomp filter against setuid
// and setgid files (jailstage.NoSetIDFilter: the program, which may own a
// share's files through its idmapped mount, can give none of them those
// bits) and execs Path. The program's own seccomp filter is its business
// (QEMU's -sandbox, in its Args).
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
	// the jail; with UID set, idmapped: their owner appears as UID, so
	// the program reads and writes what the owner may, and what it creates
	// belongs to the owner. When every share has the same owner (and the
	// stage's host paths are open to root without capabilities, see
	// ownerUserns), the stage and the program also run in a user
	// namespace that maps only that owner's uid and gid to UID and GID
	// (and Groups to themselves): the program runs as the owner's ids
	// there and sees the shares' files with their host owner, not UID.
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
	if spec.Userns {
		// The stage runs in a user namespace that maps only the shares'
		// owner (spec.UID, GID) to the program's uid and gid (s.UID, GID),
		// and its supplementary groups to themselves: the program, which
		// runs as that owner there, sees the shares' files with their
		// owner's ids (see ownerUserns). The stage's own uid, root's, is
		// not mapped there, so it keeps what it needs to build the jail as
		// ambient capabilities across its exec; it drops them all before
		// the program (jailstage.Confine).
		cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: spec.UID, HostID: s.UID, Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: spec.GID, HostID: s.GID, Size: 1}}
		for _, g := range spec.Groups {
			cmd.SysProcAttr.GidMappings = append(cmd.SysProcAttr.GidMappings, syscall.SysProcIDMap{ContainerID: g, HostID: g, Size: 1})
		}
		cmd.SysProcAttr.GidMappingsEnableSetgroups = true
		cmd.SysProcAttr.AmbientCaps = stageCaps
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
	// Shares of a program that runs as a uid of its own are idmapped
	// mounts, made here (the stage may run in a user namespace, where it
	// could not make them): the directory's owner appears as that uid in
	// the jail.
	if spec.Root != "" && s.UID != 0 && len(spec.Shares) > 0 {
		byOwner := map[[2]int]*os.File{}
		for i := range spec.Shares {
			sh := &spec.Shares[i]
			fi, err := os.Stat(sh.Src)
			if err != nil {
				return spec, extra, closers, fmt.Errorf("volume %s: %w", sh.Src, err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			owner := [2]int{int(st.Uid), int(st.Gid)}
			ns, ok := byOwner[owner]
			if !ok {
				ns, err = IdmapUserns(owner[0], owner[1], s.UID, s.GID)
				if err != nil {
					return spec, extra, closers, fmt.Errorf("volume %s: %w", sh.Src, err)
				}
				closers = append(closers, ns)
				byOwner[owner] = ns
			}
			m, err := idmappedMount(sh.Src, ns, sh.ReadOnly)
			if err != nil {
				return spec, extra, closers, err
			}
			closers = append(closers, m)
			sh.MountFD = next()
			extra = append(extra, m)
		}
		if len(byOwner) == 1 {
			for owner := range byOwner {
				if ownerUserns(s, spec, owner[0], owner[1]) != nil {
					break
				}
				root, err := jailTmpfs()
				if err != nil {
					return spec, extra, closers, err
				}
				closers = append(closers, root)
				spec.RootFD = next()
				extra = append(extra, root)
				spec.Userns = true
				spec.UID, spec.GID = owner[0], owner[1]
			}
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

// stageCaps are the capabilities a stage in a user namespace (Spec.Shares)
// keeps across its exec: mounts and pivot_root, the program's ids, and
// the drop itself (in that namespace only).
var stageCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_SETPCAP}

// ownerUserns returns nil if the stage of s (its spec so far) can run in a
// user namespace that maps only uid and gid (the owner of every share) to
// s.UID and s.GID, else why not: its supplementary groups (mapped to
// themselves) must be other ids than those two, and every host path the
// stage opens, binds or creates a socket in must be reachable by root
// through the owner, group or other bits of the files and directories on
// the way (root is not mapped in that namespace, so its capabilities do
// not override their permissions there).
func ownerUserns(s Spec, spec jailstage.Spec, uid, gid int) error {
	for _, g := range spec.Groups {
		if g == gid || g == s.GID {
			return fmt.Errorf("supplementary group %d is the owner's or the box's gid", g)
		}
	}
	type access struct {
		path string
		bits uint32 // of rwx (4, 2, 1) the path needs
	}
	var need []access
	for _, p := range spec.Listen {
		need = append(need, access{filepath.Dir(p), 3})
	}
	for _, p := range spec.Connect {
		need = append(need, access{p, 2})
	}
	for _, o := range spec.Open {
		bits := uint32(4)
		switch o.Flags & unix.O_ACCMODE {
		case unix.O_WRONLY:
			bits = 2
		case unix.O_RDWR:
			bits = 6
		}
		need = append(need, access{o.Path, bits})
	}
	for _, p := range spec.Binds {
		need = append(need, access{p, 0})
	}
	for _, f := range spec.Files {
		need = append(need, access{f.Src, 0})
	}
	for _, p := range spec.Devices {
		need = append(need, access{p, 0})
	}
	need = append(need, access{spec.Root, 0})
	for _, a := range need {
		if err := reachableByRoot(a.path, a.bits); err != nil {
			return err
		}
	}
	return nil
}

// reachableByRoot returns nil if uid 0 and gid 0, without capabilities,
// may search every directory on the way to path (made absolute) and has
// bits (rwx as 4, 2, 1) on path itself; a missing path is reachable (the
// stage skips it or fails as it would anyway).
func reachableByRoot(path string, bits uint32) error {
	path, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	allows := func(st *unix.Stat_t, want uint32) bool {
		mode := st.Mode & 0o777
		switch {
		case st.Uid == 0:
			mode >>= 6
		case st.Gid == 0:
			mode >>= 3
		}
		return mode&want == want
	}
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if unix.Stat(d, &st) == nil && !allows(&st, 1) {
			return fmt.Errorf("%s is not searchable by root without capabilities", d)
		}
		if d == "/" {
			break
		}
	}
	var st unix.Stat_t
	if bits != 0 && unix.Stat(path, &st) == nil && !allows(&st, bits) {
		return fmt.Errorf("%s is not open to root without capabilities", path)
	}
	return nil
}

// idmappedMount returns a detached mount of the directory src (not its
// submounts), idmapped through userns, private, nosuid, nodev and
// read-only if readOnly.
func idmappedMount(src string, userns *os.File, readOnly bool) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("volume %s: open_tree: %w", src, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(userns.Fd()), Propagation: unix.MS_PRIVATE}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("volume %s: idmapped mount (the file system must support idmapped mounts, Linux 5.12+): %w", src, err)
	}
	return os.NewFile(uintptr(fd), src), nil
}

// jailTmpfs returns a detached tmpfs mount for a jail's root (1 MiB,
// mode 0755, nosuid), made in this process's user namespace, where the
// stage's root may create files.
func jailTmpfs() (*os.File, error) {
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("jail root: fsopen tmpfs: %w", err)
	}
	defer unix.Close(fs)
	for _, kv := range [][2]string{{"source", "airlock-jail"}, {"size", "1m"}, {"mode", "0755"}} {
		if err := unix.FsconfigSetString(fs, kv[0], kv[1]); err != nil {
			return nil, fmt.Errorf("jail root: tmpfs %s: %w", kv[0], err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, fmt.Errorf("jail root: tmpfs: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID)
	if err != nil {
		return nil, fmt.Errorf("jail root: fsmount: %w", err)
	}
	return os.NewFile(uintptr(m), "jail-root"), nil
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

// NoSetIDCmd makes cmd (its Path, Args and Env set) start through a
// re-execution of this program (jailstage.RunNoSetID) that installs the
// seccomp filter against setuid and setgid files (jailstage.NoSetIDFilter)
// and then execs cmd's program with cmd's environment (cmd.Env, or this
// process's when nil): the program and what it starts cannot give a file
// S_ISUID or S_ISGID, nor create one with them (EPERM). The virtio-fs
// daemons start so. The pid stays the program's.
func NoSetIDCmd(cmd *exec.Cmd) {
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Args = append([]string{jailstage.NoSetIDArg0, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/proc/self/exe"
	cmd.Env = append(append([]string(nil), env...), jailstage.Env+"=1")
}
