//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/headtail"
)

const (
	defaultKillGrace = 2 * time.Second
	// drainGrace is how long the agent keeps reading a process's pipes
	// after it exited, waiting for EOF. Background children that keep the
	// pipes open would otherwise hold the exec forever; after the grace,
	// what is already in the pipes is still read, then reading stops.
	drainGrace = 150 * time.Millisecond
	chunkSize  = 32 << 10
)

// process is one running exec.
type process struct {
	pid    int
	pgid   int
	cgroup string // host path of its cgroup dir, "" without cgroups
	wait   <-chan unix.WaitStatus
	stdin  *os.File
	stdout *os.File
	stderr *os.File
	tty    *os.File // the PTY master of a tty exec, else nil

	// sigMu guards pidfd and ended: a signal from the host can arrive
	// after the process exited and was reaped, when its pid may already
	// be another process's (the guest's pid_max is small).
	sigMu sync.Mutex
	// pidfd refers to the process itself, not its pid: a signal sent
	// through it after the reap fails (ESRCH) instead of reaching a
	// process that reused the pid. -1 without one (kernels before 5.3).
	pidfd int
	ended bool // the exec is over: no signal goes to pid any more
}

// signal sends sig to the exec's process (not to its tree), unless it
// has been reaped.
func (p *process) signal(sig unix.Signal) {
	p.sigMu.Lock()
	defer p.sigMu.Unlock()
	if p.ended {
		return
	}
	if p.pidfd >= 0 {
		unix.PidfdSendSignal(p.pidfd, sig, nil, 0)
		return
	}
	unix.Kill(p.pid, sig)
}

// end marks the exec over (no signal reaches its pid from now on) and
// closes its pidfd.
func (p *process) end() {
	p.sigMu.Lock()
	defer p.sigMu.Unlock()
	p.ended = true
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
}

// withPidfd makes sys return a pidfd of the process it starts in *fd.
func withPidfd(sys *syscall.SysProcAttr, fd *int) {
	*fd = -1
	sys.PidFD = fd
}

// spawnError is a failure to start the command that the caller sees as an
// exit status and a message on stderr, as a shell would report it.
type spawnError struct {
	code int32
	msg  string
}

func (e *spawnError) Error() string { return e.msg }

var execSeq atomic.Int64

func (s *Server) spawn(st *agentpb.ExecStart) (*process, error) {
	if len(st.Argv) == 0 || st.Argv[0] == "" {
		return nil, errors.New("empty command")
	}
	root := s.cfg.Root
	wd := st.WorkingDir
	if wd == "" {
		wd = "/"
	}
	if !path.IsAbs(wd) {
		return nil, &spawnError{126, fmt.Sprintf("airlock: working directory %q is not absolute\n", wd)}
	}
	if hp, err := inRoot(root, wd); err != nil {
		return nil, &spawnError{126, fmt.Sprintf("airlock: working directory %s: %v\n", wd, err)}
	} else if fi, err := os.Stat(hp); err != nil || !fi.IsDir() {
		return nil, &spawnError{126, fmt.Sprintf("airlock: working directory %s does not exist in the box\n", wd)}
	}
	u, err := execUser(root, st.User)
	if err != nil {
		return nil, &spawnError{126, fmt.Sprintf("airlock: user %q: %v\n", st.User, err)}
	}
	env := append([]string(nil), st.Env...)
	if _, ok := getenv(env, "PATH"); !ok {
		env = append(env, "PATH="+DefaultPath)
	}
	if _, ok := getenv(env, "HOME"); !ok {
		env = append(env, "HOME="+u.Home)
	}
	bin := lookPath(root, st.Argv[0], wd, env)
	if bin == "" {
		return nil, &spawnError{127, fmt.Sprintf("airlock: %s: command not found\n", st.Argv[0])}
	}
	if st.Tty {
		return s.spawnTTY(st, bin, wd, env, u)
	}

	var files [3]*os.File
	var closers []*os.File
	defer func() {
		for _, f := range closers {
			f.Close()
		}
	}()
	p := &process{pidfd: -1}
	if st.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		files[0], p.stdin = r, w
		closers = append(closers, r)
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		files[0] = f
		closers = append(closers, f)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, err
	}
	files[1], files[2] = outW, errW
	closers = append(closers, outW, errW)
	p.stdout, p.stderr = outR, errR

	sys := &syscall.SysProcAttr{
		Setpgid: true,
		Credential: &syscall.Credential{
			Uid:         uint32(u.Uid),
			Gid:         uint32(u.Gid),
			Groups:      toU32(u.Sgids),
			NoSetGroups: false,
		},
	}
	if root != "" && root != "/" {
		sys.Chroot = root
	}
	withPidfd(sys, &p.pidfd)
	var cgfd int
	p.cgroup, cgfd = s.enterCgroup(sys)
	proc, err := startProcess(u.Uid, bin, st.Argv, &os.ProcAttr{
		Dir:   wd,
		Env:   env,
		Files: files[:],
		Sys:   sys,
	})
	if cgfd >= 0 {
		unix.Close(cgfd)
	}
	if err != nil {
		p.stdout.Close()
		p.stderr.Close()
		if p.stdin != nil {
			p.stdin.Close()
		}
		if p.cgroup != "" {
			os.Remove(p.cgroup)
		}
		code := int32(126)
		if errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		return nil, &spawnError{code, fmt.Sprintf("airlock: %s: %v\n", st.Argv[0], unwrapSyscall(err))}
	}
	p.pid = proc.Pid
	p.pgid = proc.Pid
	p.wait = s.reaper.Watch(proc.Pid)
	// Never call proc.Wait: the reaper owns exit statuses.
	proc.Release()
	return p, nil
}

func unwrapSyscall(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err
	}
	return err
}

func toU32(in []int) []uint32 {
	out := make([]uint32, len(in))
	for i, v := range in {
		out[i] = uint32(v)
	}
	return out
}

// signalTree sends sig to every process of the exec: all members of its
// cgroup when it has one (this also reaches children that called setsid),
// else its process group.
func (p *process) signalTree(sig unix.Signal) {
	if p.cgroup != "" {
		if sig == unix.SIGKILL {
			if err := os.WriteFile(filepath.Join(p.cgroup, "cgroup.kill"), []byte("1"), 0); err == nil {
				return
			}
		}
		if b, err := os.ReadFile(filepath.Join(p.cgroup, "cgroup.procs")); err == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					unix.Kill(pid, sig)
				}
			}
		}
	}
	unix.Kill(-p.pgid, sig)
}

// treeEmpty reports whether no process of the exec is left.
func (p *process) treeEmpty() bool {
	if p.cgroup != "" {
		b, err := os.ReadFile(filepath.Join(p.cgroup, "cgroup.procs"))
		return err == nil && len(strings.TrimSpace(string(b))) == 0
	}
	return unix.Kill(-p.pgid, 0) == unix.ESRCH
}

// killTree sends SIGTERM to the whole tree, then SIGKILL after grace, and
// returns when the tree is gone (or after a bounded wait).
func (p *process) killTree(grace time.Duration) {
	p.signalTree(unix.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if p.treeEmpty() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := 0; i < 100; i++ {
		p.signalTree(unix.SIGKILL)
		if p.treeEmpty() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// takeCgroup returns a new exec cgroup with the exec limits: the spare
// one when there is one, else one made now ("" without cgroups, or when
// making one failed).
func (s *Server) takeCgroup() string {
	s.cgMu.Lock()
	dir := s.spareCgroup
	s.spareCgroup = ""
	s.cgMu.Unlock()
	if dir != "" {
		return dir
	}
	return s.newCgroup()
}

// enterCgroup makes sys start its process in a new exec cgroup
// (takeCgroup) and returns the cgroup and the descriptor sys names, which
// the caller closes once the process started; "" and -1 without one.
func (s *Server) enterCgroup(sys *syscall.SysProcAttr) (dir string, fd int) {
	dir = s.takeCgroup()
	if dir == "" {
		return "", -1
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(dir)
		return "", -1
	}
	sys.UseCgroupFD, sys.CgroupFD = true, fd
	return dir, fd
}

// newCgroup makes an exec cgroup with the exec limits ("" without
// cgroups, or on failure).
func (s *Server) newCgroup() string {
	if s.cfg.CgroupRoot == "" {
		return ""
	}
	dir := filepath.Join(s.cfg.CgroupRoot, "exec-"+strconv.FormatInt(execSeq.Add(1), 10))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return ""
	}
	s.limitCgroup(dir)
	s.freezeNew(dir)
	return dir
}

// refillCgroup makes the spare exec cgroup if there is none.
func (s *Server) refillCgroup() {
	s.cgMu.Lock()
	have := s.spareCgroup != ""
	s.cgMu.Unlock()
	if have {
		return
	}
	dir := s.newCgroup()
	if dir == "" {
		return
	}
	s.cgMu.Lock()
	defer s.cgMu.Unlock()
	if s.spareCgroup != "" {
		os.Remove(dir) // made meanwhile by another exec's end
		return
	}
	s.spareCgroup = dir
}

// removeCgroup deletes the exec's cgroup once it is empty. Processes the
// exec left running in the background keep it alive; it is then left alone.
func (p *process) removeCgroup() {
	if p.cgroup != "" {
		os.Remove(p.cgroup)
	}
}

// floodAfter is how much of a stream pump reads before it treats the
// stream as a flood and lets the data of short reads pile up (see pump).
const floodAfter = 1 << 20

// pump copies one pipe to send until EOF. After drain is closed it stops
// waiting for more data: it reads what is already in the pipe and returns.
//
// Once floodAfter bytes went through, a short read is followed by a pause
// of a millisecond: the agent runs at a higher priority than the command,
// so otherwise each small write of a flooding command wakes the agent for
// one small read (and one small frame to the host), and the agent, not the
// command, is the bottleneck (docs/performance.md). Output that trickles is
// delayed by at most that millisecond.
func pump(f *os.File, drain <-chan struct{}, bufSize int, send func([]byte) error) {
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-drain:
			f.SetReadDeadline(time.Now())
		case <-stop:
		}
	}()
	buf := make([]byte, bufSize)
	draining := false
	total := 0
	for {
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), buf)
			if rerr == unix.EAGAIN {
				return draining
			}
			return true
		})
		if err != nil {
			if !draining && errors.Is(err, os.ErrDeadlineExceeded) {
				draining = true
				f.SetReadDeadline(time.Time{})
				continue
			}
			return
		}
		if rerr == unix.EINTR {
			continue
		}
		if rerr != nil || n <= 0 {
			return
		}
		if send(buf[:n]) != nil {
			return
		}
		total += n
		if !draining && total > floodAfter && n < bufSize/2 {
			time.Sleep(time.Millisecond)
		}
	}
}

// capped returns send behind lim: only the head part of each chunk is sent
// at once. A nil lim sends everything.
func capped(lim *headtail.Limiter, send func([]byte) error) func([]byte) error {
	if lim == nil {
		return send
	}
	return func(b []byte) error {
		if h := lim.Write(b); len(h) > 0 {
			return send(h)
		}
		return nil
	}
}

// Exec serves one Exec call (see agent.proto): it runs the process the
// first message starts and streams its output and exit status.
func (s *Server) Exec(stream execStream) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	st := first.GetStart()
	if st == nil {
		return errors.New("first exec message must be start")
	}
	t0 := time.Now()
	var sendMu sync.Mutex
	send := func(ev *agentpb.ExecEvent) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(ev)
	}
	p, err := s.spawn(st)
	if err != nil {
		var se *spawnError
		if !errors.As(err, &se) {
			return err
		}
		send(&agentpb.ExecEvent{Msg: &agentpb.ExecEvent_Stderr{Stderr: []byte(se.msg)}})
		return send(&agentpb.ExecEvent{Msg: &agentpb.ExecEvent_Exit{Exit: &agentpb.ExecExit{
			ExitCode: se.code, Error: strings.TrimSpace(se.msg), GuestNs: int64(time.Since(t0)),
		}}})
	}
	defer p.end()
	spawnNs := time.Since(t0)
	if err := send(&agentpb.ExecEvent{Msg: &agentpb.ExecEvent_Started{Started: &agentpb.ExecStarted{
		Pid: int32(p.pid), SpawnNs: int64(spawnNs),
	}}}); err != nil {
		p.killTree(0)
		p.stdout.Close()
		p.stderr.Close()
		if p.stdin != nil {
			p.stdin.Close()
		}
		p.removeCgroup()
		return err
	}

	grace := defaultKillGrace
	if st.KillGraceNs > 0 {
		grace = time.Duration(st.KillGraceNs)
	}
	ctx := stream.Context()
	var killOnce sync.Once
	killed := make(chan struct{})
	kill := func(g time.Duration) {
		killOnce.Do(func() {
			go func() {
				p.killTree(g)
				close(killed)
			}()
		})
	}

	// Client messages: stdin, signals, kill. The stream ending (the host
	// abandoned the call, or is gone) kills the tree while the process
	// runs; once it has exited (the host closes the call after the exit
	// status), what it left running in the background is left alone.
	exited := make(chan struct{})
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				if p.stdin != nil {
					p.stdin.Close()
				}
				select {
				case <-exited:
				default:
					kill(grace)
				}
				return
			}
			switch x := m.Msg.(type) {
			case *agentpb.ExecRequest_Stdin:
				if p.stdin != nil {
					if _, err := p.stdin.Write(x.Stdin); err != nil {
						p.stdin.Close()
					}
				}
			case *agentpb.ExecRequest_CloseStdin:
				if p.stdin != nil {
					p.stdin.Close()
				}
			case *agentpb.ExecRequest_Signal:
				p.signal(unix.Signal(x.Signal))
			case *agentpb.ExecRequest_Kill:
				kill(0)
			case *agentpb.ExecRequest_Resize:
				p.resize(x.Resize)
			}
		}
	}()

	// With MaxOutput the head of each stream is sent as it comes, the
	// tail kept here and sent at the end; the middle never leaves the guest.
	sendOut := func(b []byte) error {
		return send(&agentpb.ExecEvent{Msg: &agentpb.ExecEvent_Stdout{Stdout: b}})
	}
	sendErr := func(b []byte) error {
		return send(&agentpb.ExecEvent{Msg: &agentpb.ExecEvent_Stderr{Stderr: b}})
	}
	readSize := chunkSize
	var outLim, errLim *headtail.Limiter
	if st.MaxOutput > 0 {
		outLim, errLim = headtail.NewLimiter(st.MaxOutput), headtail.NewLimiter(st.MaxOutput)
		// Bigger reads: most of a flood is only copied into the ring.
		readSize = 256 << 10
		for _, f := range []*os.File{p.stdout, p.stderr} {
			// Through SyscallConn: f.Fd() would make the pipe blocking
			// and break the drain deadline.
			if rc, err := f.SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) })
			}
		}
	}
	drain := make(chan struct{})
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() {
		defer pumps.Done()
		pump(p.stdout, drain, readSize, capped(outLim, sendOut))
	}()
	go func() {
		defer pumps.Done()
		pump(p.stderr, drain, readSize, capped(errLim, sendErr))
	}()

	if wedgeExec() {
		// Test-only fault (TestWedgeExec, in builds with the
		// airlock_testfaults tag only): output still flows, but
		// the timeout and the exit are never acted on or reported, until
		// the host gives up on the call.
		<-ctx.Done()
		kill(0)
		return ctx.Err()
	}

	var timeout <-chan time.Time
	if st.TimeoutNs > 0 {
		t := time.NewTimer(time.Duration(st.TimeoutNs))
		defer t.Stop()
		timeout = t.C
	}
	timedOut := false
	done := ctx.Done()
	var ws unix.WaitStatus
wait:
	for {
		select {
		case ws = <-p.wait:
			// Reaped: its pid may be another process's from now on.
			p.end()
			close(exited)
			break wait
		case <-timeout:
			timedOut = true
			timeout = nil
			kill(grace)
		case <-done:
			kill(grace)
			done = nil
		}
	}
	pumpsDone := make(chan struct{})
	go func() { pumps.Wait(); close(pumpsDone) }()
	select {
	case <-pumpsDone:
	case <-time.After(drainGrace):
		close(drain)
		<-pumpsDone
	}
	if timedOut {
		// The tree must be gone before the caller hears it timed out.
		<-killed
	}
	ex := &agentpb.ExecExit{TimedOut: timedOut}
	if p.cgroup != "" {
		ex.OOMKilled = oomKills(p.cgroup) > 0
	}
	// The cgroup goes, and the next exec's is made, once the caller has
	// the exit status.
	defer s.refillCgroup()
	defer p.removeCgroup()
	if p.stdin != nil {
		p.stdin.Close()
	}
	for _, t := range []struct {
		lim  *headtail.Limiter
		send func([]byte) error
		n    *int64
	}{{outLim, sendOut, &ex.StdoutDropped}, {errLim, sendErr, &ex.StderrDropped}} {
		if t.lim == nil {
			continue
		}
		*t.n = t.lim.Dropped()
		tail := t.lim.Tail()
		for len(tail) > 0 {
			n := min(len(tail), 256<<10)
			if err := t.send(tail[:n]); err != nil {
				return err
			}
			tail = tail[n:]
		}
	}
	switch {
	case ws.Exited():
		ex.ExitCode = int32(ws.ExitStatus())
	case ws.Signaled():
		ex.Signal = int32(ws.Signal())
		ex.ExitCode = 128 + int32(ws.Signal())
	}
	ex.GuestNs = int64(time.Since(t0))
	return send(&agentpb.ExecEvent{Msg: &agentpb.ExecEvent_Exit{Exit: ex}})
}
