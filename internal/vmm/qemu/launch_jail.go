package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/defaults"
)

// startTimeout bounds how long a confined QEMU may take to come up (its
// QMP greeting) when ctx has no earlier deadline.
const startTimeout = 60 * time.Second

// jailRoot is the empty directory, beside the pid file, the launcher stage
// mounts the jail's root on (in its own mount namespace: the host sees an
// empty directory).
func jailRoot(c Config) string { return filepath.Join(filepath.Dir(c.PIDFile), boxdir.Jail) }

// jailedArgs returns QEMU's arguments for a confined start and the stage
// spec (without Args, Env and QEMU) that makes them true.
// Without pivot (an unprivileged caller that may not create user
// namespaces) QEMU sees the host's file system: the kernel, initramfs
// and migration blocker are named by host paths, and only the seccomp
// filter, no_new_privs and the descriptors remain.
func (c Config) jailedArgs(pivot bool) ([]string, stageSpec) {
	var s stageSpec
	fd := fdBase
	listen := func(path string) int {
		s.Listen = append(s.Listen, path)
		fd++
		return fd - 1
	}
	refs := argRefs{kernel: c.Kernel, initrd: c.Initrd}
	noMig := filepath.Join(filepath.Dir(c.PIDFile), boxdir.NoMigrate)
	if pivot {
		noMig = jailNoMig
		refs.kernel = jailKernel
		s.Files = append(s.Files, bindFile{Src: c.Kernel, Dst: jailKernel})
		if c.Initrd != "" {
			refs.initrd = jailInitrd
			s.Files = append(s.Files, bindFile{Src: c.Initrd, Dst: jailInitrd})
		}
	}
	for _, sock := range c.AgentSockets {
		refs.agents = append(refs.agents, "fd="+strconv.Itoa(listen(sock))+",server=on,wait=off")
	}
	qmp := listen(c.QMPSocket)
	refs.qmp = []string{"-chardev", "socket,id=qmp,fd=" + strconv.Itoa(qmp) + ",server=on,wait=off", "-mon", "chardev=qmp,mode=control"}
	if c.Network && c.NetSocket != "" {
		// The network helper connects to the socket's host path; QEMU
		// listens on the inherited descriptor.
		refs.net = "addr.type=fd,addr.str=" + strconv.Itoa(listen(c.NetSocket))
	}
	// virtio-fs daemons' sockets are root's (mode 0700) and not in the
	// jail: the stage connects to each before it drops root, and QEMU's
	// vhost-user chardev is that connected descriptor (after the
	// listening ones, before the opened files: the stage's order).
	for _, sh := range c.FSShares {
		s.Connect = append(s.Connect, sh.Socket)
		refs.fsShares = append(refs.fsShares, "fd="+strconv.Itoa(fd))
		fd++
	}
	for _, sh := range c.Shares {
		p := sh.HostDir
		if pivot {
			p = jailShares + "/" + sh.ID
			s.Shares = append(s.Shares, shareMount{Src: sh.HostDir, Dst: p, ReadOnly: sh.ReadOnly})
		}
		refs.shares = append(refs.shares, p)
	}
	var tail []string
	// open adds a descriptor set holding path opened with each of flags
	// (QEMU picks the one whose access mode it needs: it opens a writable
	// disk read-only first, for probing).
	open := func(path string, flags ...int) string {
		set := strconv.Itoa(fd)
		for _, fl := range flags {
			s.Open = append(s.Open, openFile{Path: path, Flags: fl})
			tail = append(tail, "-add-fd", "fd="+strconv.Itoa(fd)+",set="+set)
			fd++
		}
		return "/dev/fdset/" + set
	}
	for _, d := range c.Disks {
		if d.ReadOnly {
			refs.disks = append(refs.disks, open(d.Path, unix.O_RDONLY))
		} else {
			refs.disks = append(refs.disks, open(d.Path, unix.O_RDWR, unix.O_RDONLY))
		}
	}
	// RAM images (a restore's, see ramimage.go): inherited descriptors the
	// stage moves after the opened files; QEMU opens each through its own
	// /proc/self/fd (memory-backend-file takes a path).
	ramFDs := c.ramImageFDs(fd)
	for _, v := range ramFDs {
		if v >= 0 {
			s.Inherit = append(s.Inherit, -1) // launchJailed fills in the stage's number
			fd++
		}
	}
	refs.ram = ramImageRefs(ramFDs)
	s.Proc = len(s.Inherit) > 0
	// No image locks: QEMU takes them on the descriptor it dups from a
	// set, and, reactivating the disks after a migration (cont after a
	// snapshot), fails to take the write lock the set's other descriptor
	// conflicts with. The box's lock file keeps a second QEMU off its
	// disks.
	refs.diskOpts = ",file.locking=off"
	// The console goes to the drainer's pipe (fdConsole, see startDrainer).
	refs.console = "path=/dev/fdset/" + strconv.Itoa(fdConsole) + ",append=on"
	tail = append(tail, "-add-fd", "fd="+strconv.Itoa(fdConsole)+",set="+strconv.Itoa(fdConsole))
	if !c.Jail.NoSeccomp {
		tail = append(tail, "-sandbox", SandboxArg)
	}
	tail = append(tail, "-blockdev", noMigrateBlockdev(noMig))
	refs.tail = tail
	if !pivot {
		s.NoMigrate = noMig
		s.UID, s.GID = c.Jail.UID, c.Jail.GID
		return c.args(refs), s
	}
	s.Binds = append(s.Binds, systemDirs...)
	s.Devices = []string{"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"}
	if c.Accel == AccelKVM {
		s.Devices = append(s.Devices, "/dev/kvm")
	}
	if c.VsockCID != 0 {
		s.Devices = append(s.Devices, "/dev/vhost-vsock")
	}
	s.Root = jailRoot(c)
	s.UID, s.GID, s.Groups = c.Jail.UID, c.Jail.GID, c.Jail.Groups
	if s.Groups == nil {
		s.Groups = []int{}
	}
	s.THPOff = c.THP == THPNone
	return c.args(refs), s
}

// launchJailed starts QEMU through the launcher stage (see Jail).
func launchJailed(ctx context.Context, qemuPath string, c Config) (int, error) {
	if c.Jail.UID != 0 && os.Geteuid() != 0 {
		return 0, fmt.Errorf("confinement: running QEMU as uid %d needs root", c.Jail.UID)
	}
	pivot := (os.Geteuid() == 0 || UserNSAllowed() == nil) && !c.Jail.NoPivot
	args, spec := c.jailedArgs(pivot)
	spec.Args = args
	spec.QEMU = qemuPath
	if !inJail(qemuPath) {
		spec.Binds = append(spec.Binds, filepath.Dir(qemuPath))
	}
	spec.Env = qemuEnv(c.THP)
	if spec.Root != "" {
		if err := os.MkdirAll(spec.Root, 0o700); err != nil {
			return 0, fmt.Errorf("jail root: %w", err)
		}
	}
	if c.Jail.UID != 0 {
		// QEMU opens the kernel and initramfs itself (no descriptor
		// passing for -kernel), as another uid: they must be readable by
		// all. They hold nothing secret (a kernel; the agent and kernel
		// modules).
		for _, f := range spec.Files {
			if err := worldReadable(f.Src); err != nil {
				return 0, err
			}
		}
	}
	// Shares of a QEMU that runs as the box's uid are idmapped: the
	// directory's owner appears as that uid in the jail.
	var usernsFiles []*os.File
	defer func() {
		for _, f := range usernsFiles {
			f.Close()
		}
	}()
	if spec.Root != "" && c.Jail.UID != 0 {
		byOwner := map[[2]int]int{}
		for i := range spec.Shares {
			fi, err := os.Stat(spec.Shares[i].Src)
			if err != nil {
				return 0, fmt.Errorf("volume %s: %w", spec.Shares[i].Src, err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			owner := [2]int{int(st.Uid), int(st.Gid)}
			fd, ok := byOwner[owner]
			if !ok {
				f, err := idmapUserns(owner[0], owner[1], c.Jail.UID, c.Jail.GID)
				if err != nil {
					return 0, fmt.Errorf("volume %s: %w", spec.Shares[i].Src, err)
				}
				usernsFiles = append(usernsFiles, f)
				fd = fdUsernsBase + len(usernsFiles) - 1
				byOwner[owner] = fd
			}
			spec.Shares[i].UsernsFD = fd
		}
	}
	// The RAM images come after the user namespaces in ExtraFiles, the
	// lease after them.
	var ramFiles []*os.File
	for _, f := range c.RAMImages {
		if f != nil {
			spec.Inherit[len(ramFiles)] = fdUsernsBase + len(usernsFiles) + len(ramFiles)
			ramFiles = append(ramFiles, f)
		}
	}
	if c.Jail.DieWithCaller {
		l, err := lease()
		if err != nil {
			return 0, err
		}
		spec.Lease = fdUsernsBase + len(usernsFiles) + len(ramFiles)
		ramFiles = append(ramFiles, l)
	}
	os.Remove(ExitFile(c))
	// A socket of an earlier boot would make bind fail.
	for _, p := range spec.Listen {
		os.Remove(p)
	}

	specR, specW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer specR.Close()
	defer specW.Close()
	logR, logW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	logOwned := false // by the reader of QEMU's stderr once QEMU runs
	defer func() {
		if !logOwned {
			logR.Close()
		}
	}()
	fd4, fd5 := (*os.File)(nil), (*os.File)(nil)
	if c.Secret != nil {
		sp, peer, err := secretPair(c.Secret)
		if err != nil {
			logW.Close()
			return 0, err
		}
		defer sp.Close()
		defer peer.Close()
		fd4, fd5 = sp, peer
	}
	// The console drainer's pipe; the drainer starts after the stage, so
	// that the stage's start (on the way to QEMU) does not wait for it.
	consoleR, console, err := os.Pipe()
	if err != nil {
		logW.Close()
		return 0, err
	}
	consoleOwned := false // by the drainer's start once the stage runs
	defer func() {
		if !consoleOwned {
			consoleR.Close()
		}
	}()
	defer console.Close()
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       []string{stageArg0},
		Env:        stageEnviron(),
		Stdout:     logW,
		Stderr:     logW,
		ExtraFiles: append(append([]*os.File{specR, fd4, fd5, console}, usernsFiles...), ramFiles...),
		SysProcAttr: &syscall.SysProcAttr{
			Setsid:     true,
			Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
		},
	}
	if fd4 == nil {
		// Keep descriptor numbers fixed: fd 4 is /dev/null.
		null, err := os.Open(os.DevNull)
		if err != nil {
			logW.Close()
			return 0, err
		}
		defer null.Close()
		cmd.ExtraFiles[1], cmd.ExtraFiles[2] = null, null
	}
	if !c.Jail.HostNetwork {
		cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWNET
	}
	if !pivot {
		cmd.SysProcAttr.Cloneflags = 0
	} else if os.Geteuid() != 0 {
		cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWUSER
		// uid 0 in the namespace (the caller's uid outside): the stage
		// keeps the namespace's capabilities across its exec to build
		// the jail, then drops them all before QEMU (see dropCaps).
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		cmd.SysProcAttr.GidMappingsEnableSetgroups = false
		spec.Groups = nil
	}
	if c.Jail.DieWithCaller {
		// The stage's parent-death signal follows the thread that
		// started it: one that never ends.
		err = onLaunchThread(cmd.Start)
	} else {
		err = cmd.Start()
	}
	logW.Close()
	console.Close() // QEMU holds the pipe now: the drainer ends when QEMU does
	if err != nil {
		return 0, fmt.Errorf("start the QEMU launcher: %w (set AIRLOCK_CONFINE=off to start QEMU unconfined)", err)
	}
	pid := cmd.Process.Pid
	// The pid file names the process from its start, not only once QEMU
	// is up: a start cut short (this process killed) leaves a QEMU that a
	// removal of the box finds there (KillStray).
	os.WriteFile(c.PIDFile, []byte(strconv.Itoa(pid)+"\n"), 0o600)
	logOwned = true
	exited := make(chan struct{})
	var waitErr error
	// QEMU's and the stage's messages, for QEMU's whole life (a failed
	// migration load, a device error): bounded, its first and last
	// stderrKeep bytes.
	qlog := &headTail{max: stderrKeep}
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		io.Copy(qlog, logR)
		logR.Close()
	}()
	go func() {
		// QEMU is this process's child: reap it whenever it exits, and
		// keep how it ended (a seccomp kill is "bad system call") with
		// what it printed.
		waitErr = cmd.Wait()
		if waitErr != nil {
			select {
			case <-logDone:
			case <-time.After(time.Second):
			}
			rec := waitErr.Error() + "\n"
			if m := strings.TrimSpace(qlog.String()); m != "" {
				rec += m + "\n"
			}
			os.WriteFile(ExitFile(c), []byte(rec), 0o600)
		}
		close(exited)
	}()
	fail := func(err error) (int, error) {
		cmd.Process.Kill()
		<-exited
		return 0, err
	}
	if g := c.Jail.Cgroup; g != nil {
		if err := g.Add(pid); err != nil {
			return fail(err)
		}
	}
	if err := json.NewEncoder(specW).Encode(&spec); err != nil {
		return fail(fmt.Errorf("send the QEMU launcher its spec: %w", err))
	}
	specW.Close()
	// The drainer (a fork and exec of this program) starts while QEMU
	// does, not before: QEMU's start waits for nothing of it. A drainer
	// that cannot start ends QEMU, and the launch fails saying why.
	consoleOwned = true
	drainer := make(chan error, 1)
	go func() {
		err := startDrainer(consoleR, c.ConsoleLog, c.ConsoleMax, c.Jail.Cgroup, c.Jail.UID)
		consoleR.Close() // the drainer holds it now
		if err != nil {
			cmd.Process.Kill()
		}
		drainer <- err
	}()

	msg := func() string {
		select {
		case <-logDone:
		case <-time.After(200 * time.Millisecond):
		}
		m := strings.TrimSpace(qlog.String())
		if m == "" && waitErr != nil {
			m = waitErr.Error()
		}
		return m
	}
	deadline := time.Now().Add(startTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	err = waitReady(ctx, c.QMPSocket, deadline, exited)
	if derr := <-drainer; derr != nil {
		return fail(fmt.Errorf("console drainer: %w", derr))
	}
	if err != nil {
		select {
		case <-exited:
			return 0, fmt.Errorf("qemu failed to start: %s", msg())
		case <-time.After(time.Second):
		}
		return fail(fmt.Errorf("qemu did not come up: %w", err))
	}
	os.WriteFile(c.PIDFile, []byte(strconv.Itoa(pid)+"\n"), 0o600)
	return pid, nil
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

// stageEnviron is the launcher stage's environment: the allowlisted
// variables (defaults.ChildEnv), the Go runtime's settings and the marker
// that makes the program a stage. The stage runs as root until it execs
// QEMU with the spec's environment; neither holds a secret of the caller's.
func stageEnviron() []string {
	return append(defaults.ChildEnv(defaults.GoRuntimeEnv...), stageEnv+"=1")
}

// idmapUserns returns a user namespace (its /proc/PID/ns/user, open) that
// maps only uid and gid inside to boxUID and boxGID outside: a mount
// idmapped through it shows the files of uid:gid as boxUID:boxGID's, and
// files boxUID creates there belong to uid:gid on disk.
func idmapUserns(uid, gid, boxUID, boxGID int) (*os.File, error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{stageArg0 + "-hold"}
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
func worldReadable(file string) error {
	fi, err := os.Stat(file)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return nil
	}
	if err := os.Chmod(file, fi.Mode().Perm()|0o444); err != nil {
		return fmt.Errorf("%s must be readable by the box's QEMU uid: %w (chmod a+r it)", file, err)
	}
	return nil
}

// ExitFile is where Launch records how a confined QEMU it started ended,
// when not with status 0 ("signal: bad system call" is a seccomp kill),
// followed by what QEMU printed on stderr (its first and last 16 KiB).
// It is only written while the starting process lives.
func ExitFile(c Config) string { return filepath.Join(filepath.Dir(c.PIDFile), boxdir.QEMUExit) }

// waitReady waits until QEMU's QMP socket answers a command (QEMU has
// finished setting up the machine, as when -daemonize returns).
func waitReady(ctx context.Context, sock string, deadline time.Time, exited <-chan struct{}) error {
	for {
		select {
		case <-exited:
			return errors.New("exited")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("no QMP greeting in time")
		}
		conn, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
		done := make(chan struct{})
		go func() {
			select {
			case <-exited:
				conn.SetDeadline(time.Now())
			case <-done:
			}
		}()
		conn.SetDeadline(deadline)
		// The greeting comes from the monitor's I/O thread, possibly before
		// the machine is built; a command's answer comes from the main
		// loop, which runs once QEMU has finished starting.
		rd := bufio.NewReader(conn)
		_, err = readQMPLine(rd)
		if err == nil {
			_, err = conn.Write([]byte(`{"execute":"qmp_capabilities"}` + "\n"))
		}
		if err == nil {
			_, err = readQMPLine(rd)
		}
		close(done)
		stop()
		conn.Close()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited")
		default:
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("qmp greeting: %w", err)
	}
}

// secretPair returns both ends of a unix socket pair: QEMU's secret port
// chardev reads the first, on which secret and a newline wait. QEMU must
// also hold the other end (unused): a socket whose peer has closed hangs
// up, and QEMU drops a hung-up chardev's unread bytes.
func secretPair(secret []byte) (qemuEnd, peer *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if _, err := unix.Write(fds[0], append(append([]byte{}, secret...), '\n')); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[1]), "secret"), os.NewFile(uintptr(fds[0]), "secret-peer"), nil
}

// UserNSAllowed returns nil if this process may create a user namespace
// (with mount, pid and network namespaces in it), else why not.
func UserNSAllowed() error {
	userNSOnce.Do(func() {
		if os.Geteuid() == 0 {
			return
		}
		cmd := exec.Command("/proc/self/exe")
		cmd.Args = []string{stageArg0 + "-probe"}
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

// stderrKeep is how much of a confined QEMU's stderr is kept, at each end.
const stderrKeep = 16 << 10

// headTail is an io.Writer that keeps the first and the last max bytes
// written to it.
type headTail struct {
	mu         sync.Mutex
	max        int
	head, tail []byte
	dropped    int64
}

func (h *headTail) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(p)
	if room := h.max - len(h.head); room > 0 {
		k := min(room, len(p))
		h.head = append(h.head, p[:k]...)
		p = p[k:]
	}
	h.tail = append(h.tail, p...)
	if over := len(h.tail) - h.max; over > 0 {
		h.dropped += int64(over)
		h.tail = append(h.tail[:0], h.tail[over:]...)
	}
	return n, nil
}

// String returns what was kept; a cut in the middle is marked.
func (h *headTail) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dropped > 0 {
		return string(h.head) + fmt.Sprintf("\n[... %d bytes ...]\n", h.dropped) + string(h.tail)
	}
	return string(h.head) + string(h.tail)
}
