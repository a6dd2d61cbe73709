package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/confine"
)

// startTimeout bounds how long a confined QEMU may take to come up (its
// QMP greeting) when ctx has no earlier deadline.
const startTimeout = 60 * time.Second

// jailRoot is the empty directory, beside the pid file, the launcher stage
// mounts the jail's root on (in its own mount namespace: the host sees an
// empty directory).
func jailRoot(c Config) string { return filepath.Join(filepath.Dir(c.PIDFile), boxdir.Jail) }

// jailedArgs returns QEMU's arguments for a confined start and the
// confinement (without Path, Args, Env and the caller's files) that makes
// them true.
// Without pivot (an unprivileged caller that may not create user
// namespaces) QEMU sees the host's file system: the kernel, initramfs
// and migration blocker are named by host paths, and only the seccomp
// filter, no_new_privs and the descriptors remain.
func (c Config) jailedArgs(pivot bool) ([]string, confine.Spec) {
	s := confine.Spec{Name: "QEMU"}
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
		s.Files = append(s.Files, confine.BindFile{Src: c.Kernel, Dst: jailKernel})
		if c.Initrd != "" {
			refs.initrd = jailInitrd
			s.Files = append(s.Files, confine.BindFile{Src: c.Initrd, Dst: jailInitrd})
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
			s.Shares = append(s.Shares, confine.ShareMount{Src: sh.HostDir, Dst: p, ReadOnly: sh.ReadOnly})
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
			s.Open = append(s.Open, confine.OpenFile{Path: path, Flags: fl})
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
	for _, f := range c.RAMImages {
		if f != nil {
			s.Inherit = append(s.Inherit, f)
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
	s.HostNetwork = c.Jail.HostNetwork
	s.Cgroup = c.Jail.Cgroup
	s.DieWithCaller = c.Jail.DieWithCaller
	if !pivot {
		s.Write = []confine.WriteFile{{Path: noMig, Data: noMigrateQcow(), Mode: 0o600}}
		s.UID, s.GID = c.Jail.UID, c.Jail.GID
		return c.args(refs), s
	}
	s.Write = []confine.WriteFile{{Path: noMig, Data: noMigrateQcow(), Mode: 0o444}}
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
	s.THPOff = c.THP == THPNone
	return c.args(refs), s
}

// launchJailed starts QEMU through the launcher stage (see Jail and
// confine.Start).
func launchJailed(ctx context.Context, qemuPath string, c Config) (int, error) {
	if c.Jail.UID != 0 && os.Geteuid() != 0 {
		return 0, fmt.Errorf("confinement: running QEMU as uid %d needs root", c.Jail.UID)
	}
	pivot := confine.JailAllowed() && !c.Jail.NoPivot
	args, spec := c.jailedArgs(pivot)
	spec.Args = args
	spec.Path = qemuPath
	if !inJail(qemuPath) {
		spec.Binds = append(spec.Binds, filepath.Dir(qemuPath))
	}
	spec.Env = qemuEnv(c.THP)
	spec.PIDFile = c.PIDFile
	spec.StartHint = "set AIRLOCK_CONFINE=off to start QEMU unconfined"
	os.Remove(ExitFile(c))

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
	var fd4, fd5 *os.File // nil: /dev/null (descriptor numbers stay fixed)
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
	spec.Keep = []*os.File{fd4, fd5, console} // fdSecret, fdSecretPeer, fdConsole
	spec.Stdout, spec.Stderr = logW, logW
	st, err := confine.Start(spec)
	logW.Close()
	console.Close() // QEMU holds the pipe now: the drainer ends when QEMU does
	if err != nil {
		return 0, err
	}
	cmd := st.Cmd
	// The pid file names the process from its start (confine.Start wrote
	// it), not only once QEMU is up: a start cut short (this process
	// killed) leaves a QEMU that a removal of the box finds there
	// (KillStray).
	pid := st.Pid()
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
			// Whole or not at all: a reader (exitRecord) takes the file as
			// soon as it exists.
			if tmp := ExitFile(c) + ".tmp"; os.WriteFile(tmp, []byte(rec), 0o600) == nil {
				os.Rename(tmp, ExitFile(c))
			}
		}
		close(exited)
	}()
	fail := func(err error) (int, error) {
		cmd.Process.Kill()
		<-exited
		return 0, err
	}
	if err := st.Go(); err != nil {
		return fail(err)
	}
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
