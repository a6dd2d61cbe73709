//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/moby/sys/user"
	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
)

// openPTY opens a new PTY pair on the box's devpts instance (so that the
// process sees its /dev/pts/N inside the box), falling back to the agent's
// /dev/ptmx. The slave is opened through TIOCGPTPEER, without a path.
func openPTY(root string, rows, cols uint32) (master, slave *os.File, err error) {
	if rows == 0 || cols == 0 {
		rows, cols = 24, 80
	}
	var m *os.File
	for _, p := range []string{filepath.Join(root, "dev/pts/ptmx"), filepath.Join(root, "dev/ptmx"), "/dev/ptmx"} {
		m, err = os.OpenFile(p, os.O_RDWR|unix.O_NOCTTY, 0)
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open a PTY: %w", err)
	}
	fail := func(what string, err error) (*os.File, *os.File, error) {
		m.Close()
		return nil, nil, fmt.Errorf("PTY %s: %w", what, err)
	}
	rc, err := m.SyscallConn()
	if err != nil {
		return fail("conn", err)
	}
	var sfd int
	var ierr error
	rc.Control(func(fd uintptr) {
		if ierr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ierr != nil {
			return
		}
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
		if ierr != nil {
			return
		}
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
		if errno == 0 {
			sfd = int(r)
			return
		}
		// Kernels before 4.13: open the slave by number.
		n, err := unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
		if err != nil {
			ierr = err
			return
		}
		dir := filepath.Join(root, "dev/pts")
		sfd, ierr = unix.Open(filepath.Join(dir, strconv.Itoa(int(n))), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	})
	if ierr != nil {
		return fail("setup", ierr)
	}
	unix.CloseOnExec(sfd)
	return m, os.NewFile(uintptr(sfd), "pty"), nil
}

// ttyGroup returns the gid of the box's "tty" group (/etc/group under
// root), or def when it has none.
func ttyGroup(root string, def int) int {
	p, err := inRoot(root, "/etc/group")
	if err != nil {
		return def
	}
	gs, err := user.ParseGroupFileFilter(p, func(g user.Group) bool { return g.Name == "tty" })
	if err != nil || len(gs) == 0 {
		return def
	}
	return gs[0].Gid
}

// giveTTY makes the PTY slave the exec user's, as login and sshd do:
// owned by uid, group gid (the tty group), mode 0620. A slave left to
// root could not be opened again by its own process (tty, /dev/pts/N,
// mesg), and its mode is what the user decides.
func giveTTY(slave *os.File, uid, gid int) error {
	rc, err := slave.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	rc.Control(func(fd uintptr) {
		if ferr = unix.Fchown(int(fd), uid, gid); ferr == nil {
			ferr = unix.Fchmod(int(fd), 0o620)
		}
	})
	if ferr != nil {
		return fmt.Errorf("PTY owner: %w", ferr)
	}
	return nil
}

// resize sets the PTY's size; the kernel sends the process group SIGWINCH.
func (p *process) resize(sz *agentpb.TTYSize) {
	if p.tty == nil || sz == nil || sz.Rows == 0 || sz.Cols == 0 {
		return
	}
	if rc, err := p.tty.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(sz.Rows), Col: uint16(sz.Cols)})
		})
	}
}

// spawnTTY starts bin on a new PTY: its own session, the PTY as its
// controlling terminal and as stdin, stdout and stderr. The master is the
// process's stdout (what it writes) and stdin (what the host types);
// stderr is an empty pipe, since a terminal merges both.
func (s *Server) spawnTTY(st *agentpb.ExecStart, bin, wd string, env []string, u *user.ExecUser) (*process, error) {
	if _, ok := getenv(env, "TERM"); !ok {
		env = append(env, "TERM=xterm")
	}
	master, slave, err := openPTY(s.cfg.Root, st.Rows, st.Cols)
	if err != nil {
		return nil, err
	}
	defer slave.Close()
	if err := giveTTY(slave, u.Uid, ttyGroup(s.cfg.Root, u.Gid)); err != nil {
		master.Close()
		return nil, err
	}
	in, err := dupFile(master)
	if err != nil {
		master.Close()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		master.Close()
		in.Close()
		return nil, err
	}
	errW.Close()
	p := &process{stdin: in, stdout: master, stderr: errR, tty: master, pidfd: -1}
	cleanup := func() {
		master.Close()
		in.Close()
		errR.Close()
	}
	sys := &syscall.SysProcAttr{
		Setsid:  true,
		Setctty: true,
		Ctty:    0,
		Credential: &syscall.Credential{
			Uid: uint32(u.Uid), Gid: uint32(u.Gid), Groups: toU32(u.Sgids),
		},
	}
	if root := s.cfg.Root; root != "" && root != "/" {
		sys.Chroot = root
	}
	withPidfd(sys, &p.pidfd)
	var cgfd int
	p.cgroup, cgfd = s.enterCgroup(sys)
	proc, err := startProcess(u.Uid, bin, st.Argv, &os.ProcAttr{
		Dir: wd, Env: env, Files: []*os.File{slave, slave, slave}, Sys: sys,
	})
	if cgfd >= 0 {
		unix.Close(cgfd)
	}
	if err != nil {
		cleanup()
		if p.cgroup != "" {
			os.Remove(p.cgroup)
		}
		code := int32(126)
		if errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		return nil, &spawnError{code, fmt.Sprintf("airlock: %s: %v\n", st.Argv[0], unwrapSyscall(err))}
	}
	p.pid, p.pgid = proc.Pid, proc.Pid
	p.wait = s.reaper.Watch(proc.Pid)
	proc.Release()
	return p, nil
}

func dupFile(f *os.File) (*os.File, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var nfd int
	var derr error
	rc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
	if derr != nil {
		return nil, derr
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}
