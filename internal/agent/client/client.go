// Package client is the host side of the agent protocol: it dials a box's
// agent through any byte stream (virtio-serial unix socket, vsock, or a test
// socket), performs the handshake, and offers typed calls. Callers never see
// protobuf messages.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/transport"
)

// ErrHostileAgent is the cause of a connection the host cut off because
// the agent broke the protocol's limits (Client.Err): code in the box may
// have replaced it.
var ErrHostileAgent = transport.ErrHostileAgent

// Client is a connection to one guest agent.
type Client struct {
	t     *transport.Client
	tails tails
}

// tails counts the execs whose exit status this client has and whose call
// the agent has not ended yet: after sending the status it removes the
// exec's cgroup and makes the next exec's (see WaitExecsEnded).
type tails struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0
}

func (t *tails) add() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		t.zero = make(chan struct{})
	}
	t.n++
}

func (t *tails) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n--; t.n == 0 {
		close(t.zero)
	}
}

// tailWait bounds how long the agent's end of one exec call is waited for
// in the background.
const tailWait = 2 * time.Second

// WaitExecsEnded waits up to d (or until ctx ends) for the agent to end
// the calls of every exec whose exit status this client has received:
// the agent does an exec's cleanup (its cgroup removed, the next exec's
// made) after sending the status, and a memory snapshot taken meanwhile
// would carry that work into every box restored from it. Execs still
// running are not waited for.
func (c *Client) WaitExecsEnded(ctx context.Context, d time.Duration) {
	c.tails.mu.Lock()
	n, zero := c.tails.n, c.tails.zero
	c.tails.mu.Unlock()
	if n == 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-zero:
	case <-t.C:
	case <-ctx.Done():
	}
}

// Dial opens a byte stream with dial, performs the handshake (bounded by
// ctx's deadline, or 30 s) and returns a client.
func Dial(ctx context.Context, dial func(ctx context.Context) (net.Conn, error)) (*Client, error) {
	return DialAuth(ctx, nil, dial)
}

// DialAuth is Dial proving knowledge of the box's secret in the handshake
// (an agent that has a secret serves nobody else).
func DialAuth(ctx context.Context, secret []byte, dial func(ctx context.Context) (net.Conn, error)) (*Client, error) {
	conn, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Second)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	t, err := transport.NewClientAuth(conn, deadline, secret)
	if !stop() {
		// ctx ended meanwhile and put a past read deadline on conn: a
		// failed handshake then says so, not that it timed out.
		if err == nil {
			t.Close()
		}
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	// Host and agent are built together: a box still running an agent of
	// another protocol version must be restarted to talk to this host.
	if t.AgentVersion != agentpb.Version {
		t.Close()
		return nil, fmt.Errorf("the box runs guest agent %s, this airlock needs %s: stop the box and start it again to boot the current agent", t.AgentVersion, agentpb.Version)
	}
	return &Client{t: t}, nil
}

// SetStalled tells the connection's keepalive how to see a box that
// cannot answer for now but is not dead (paused, or running slowly): see
// transport.Client.SetStalled.
func (c *Client) SetStalled(f func(unanswered time.Duration) bool) { c.t.SetStalled(f) }

// AgentVersion is the version the agent announced in the handshake.
func (c *Client) AgentVersion() string { return c.t.AgentVersion }

// Err returns why the host ended the connection: the agent stopped
// answering (transport.ErrAgentUnresponsive) or broke the protocol's
// limits (transport.ErrHostileAgent); nil otherwise.
func (c *Client) Err() error { return c.t.Err() }

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.t.Done() }

// Close closes the connection. Running execs are killed by the agent.
func (c *Client) Close() error { return c.t.Close() }

// Info describes the guest.
type Info struct {
	Version string        // agent version
	Kernel  string        // guest kernel release
	Uptime  time.Duration // time since the guest booted
}

// CallTimeout bounds a request/response call (Hello, Shutdown) whose ctx
// has no deadline: an agent that does not answer in this time is taken as
// wedged. Generous, for TCG guests under load.
const CallTimeout = 30 * time.Second

// withDeadline gives ctx a CallTimeout deadline when it has none.
func withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, CallTimeout)
}

// Hello checks the agent answers and returns what it reports. Without a
// deadline on ctx it gives up after CallTimeout.
func (c *Client) Hello(ctx context.Context) (Info, error) {
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	r := new(agentpb.HelloResponse)
	if err := c.t.Unary(ctx, agentpb.MethodHello, &agentpb.HelloRequest{}, r); err != nil {
		return Info{}, err
	}
	return Info{Version: r.Version, Kernel: r.Kernel, Uptime: time.Duration(r.UptimeNs)}, nil
}

// Shutdown asks the agent to stop all processes, sync and power off.
// Without a deadline on ctx it gives up after CallTimeout.
func (c *Client) Shutdown(ctx context.Context) error {
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	return c.t.Unary(ctx, agentpb.MethodShutdown, &agentpb.ShutdownRequest{}, new(agentpb.ShutdownResponse))
}

// Restored tells the agent of a box restored from a memory snapshot to add
// entropy to the kernel RNG, step the clock to unixNs and take hostname;
// it returns how far the clock was stepped.
func (c *Client) Restored(ctx context.Context, entropy []byte, unixNs int64, hostname string) (time.Duration, error) {
	r := new(agentpb.RestoredResponse)
	req := &agentpb.RestoredRequest{Entropy: entropy, UnixNs: unixNs, Hostname: hostname}
	if err := c.t.Unary(ctx, agentpb.MethodRestored, req, r); err != nil {
		return 0, err
	}
	return time.Duration(r.StepNs), nil
}

// Freeze stops (freeze true) or continues the box's processes, every one
// an exec started, around a memory snapshot: a box restored from the
// snapshot runs none of them before Restored, which reseeds its RNG and
// then continues them. The agent continues them by itself after
// agent.FreezeMax.
func (c *Client) Freeze(ctx context.Context, freeze bool) error {
	return c.t.Unary(ctx, agentpb.MethodFreeze, &agentpb.FreezeRequest{Freeze: freeze}, new(agentpb.FreezeResponse))
}

// Spec describes one process to run in the guest.
type Spec struct {
	Argv       []string
	Env        []string // complete environment
	WorkingDir string
	User       string
	Stdin      bool          // give the process a stdin pipe (else /dev/null)
	Timeout    time.Duration // 0 = none; the agent kills the tree and reports TimedOut
	KillGrace  time.Duration // SIGTERM -> SIGKILL grace; 0 = agent default (2 s)
	TTY        bool          // run on a PTY (output all on stdout)
	Rows, Cols int           // the PTY's initial size; 0 = 24x80
	// MaxOutput makes the agent keep at most this many bytes of each
	// stream (head and tail) and drop the rest in the guest; 0 = all.
	MaxOutput int64
}

// Exit is how a process ended.
type Exit struct {
	Code     int
	Signal   syscall.Signal
	TimedOut bool
	Error    string
	GuestNs  int64 // agent-side duration, receipt of the request to exit
	SpawnNs  int64 // agent-side process creation time
	PID      int
	// StdoutDropped and StderrDropped count bytes the agent dropped
	// (Spec.MaxOutput).
	StdoutDropped, StderrDropped int64
	OOMKilled                    bool // the guest OOM killer killed one of its processes
}

// Proc is a running process. Its output is written to the writers given to
// Exec, in order per stream; Wait returns after all of it was written.
type Proc struct {
	c      *Client
	t      *transport.Client
	stream *transport.Stream
	done   chan struct{}
	exit   Exit
	err    error
}

// Exec starts spec and delivers output to stdout and stderr (which may be
// nil to discard). A slow writer slows the process down: the guest stops
// reading its pipes until the writer takes the data (bounded memory).
// Cancelling ctx kills the process tree in the guest.
func (c *Client) Exec(ctx context.Context, spec Spec, stdout, stderr io.Writer) (*Proc, error) {
	stream, err := c.t.Call(ctx, agentpb.MethodExec)
	if err != nil {
		return nil, err
	}
	err = stream.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Start{Start: &agentpb.ExecStart{
		Argv:        spec.Argv,
		Env:         spec.Env,
		WorkingDir:  spec.WorkingDir,
		User:        spec.User,
		Stdin:       spec.Stdin,
		TimeoutNs:   int64(spec.Timeout),
		KillGraceNs: int64(spec.KillGrace),
		Tty:         spec.TTY,
		Rows:        uint32(max(spec.Rows, 0)),
		Cols:        uint32(max(spec.Cols, 0)),
		MaxOutput:   spec.MaxOutput,
	}}})
	if err != nil {
		stream.Close()
		return nil, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	p := &Proc{c: c, t: c.t, stream: stream, done: make(chan struct{})}
	go p.recv(stdout, stderr)
	return p, nil
}

func (p *Proc) recv(stdout, stderr io.Writer) {
	defer close(p.done)
	// The exit status is the last message: end the call then, and count
	// the agent's end of it as pending until it arrives.
	exited := false
	defer func() {
		p.stream.Close()
		if exited {
			p.c.tails.add()
			go func() {
				defer p.c.tails.done()
				p.stream.WaitPeerClose(tailWait)
			}()
		}
	}()
	var outErr error
	for {
		ev := new(agentpb.ExecEvent)
		if err := p.stream.Recv(ev); err != nil {
			if err == io.EOF {
				err = errors.New("agent ended the exec without an exit status")
			}
			if kerr := p.t.Err(); kerr != nil {
				err = kerr // the session was ended for not answering
			}
			p.err = err
			return
		}
		switch x := ev.Msg.(type) {
		case *agentpb.ExecEvent_Started:
			p.exit.PID = int(x.Started.Pid)
			p.exit.SpawnNs = x.Started.SpawnNs
		case *agentpb.ExecEvent_Stdout:
			if outErr == nil {
				_, outErr = stdout.Write(x.Stdout)
			}
		case *agentpb.ExecEvent_Stderr:
			if outErr == nil {
				_, outErr = stderr.Write(x.Stderr)
			}
		case *agentpb.ExecEvent_Exit:
			p.exit.Code = int(x.Exit.ExitCode)
			p.exit.Signal = syscall.Signal(x.Exit.Signal)
			p.exit.TimedOut = x.Exit.TimedOut
			p.exit.Error = x.Exit.Error
			p.exit.GuestNs = x.Exit.GuestNs
			p.exit.StdoutDropped = x.Exit.StdoutDropped
			p.exit.StderrDropped = x.Exit.StderrDropped
			p.exit.OOMKilled = x.Exit.OOMKilled
			exited = true
			if outErr != nil {
				p.err = fmt.Errorf("writing exec output: %w", outErr)
			}
			return
		}
	}
}

func (p *Proc) send(m *agentpb.ExecRequest) error {
	return p.stream.Send(m)
}

// stdinChunk bounds one stdin message (well under transport.MaxFrame).
const stdinChunk = 256 << 10

// WriteStdin sends data to the process's stdin (Spec.Stdin must be set).
// It returns once the data is on its way; a process that does not read its
// stdin slows WriteStdin down (bounded memory).
func (p *Proc) WriteStdin(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), stdinChunk)
		if err := p.send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Stdin{Stdin: b[:n]}}); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// CloseStdin closes the process's stdin.
func (p *Proc) CloseStdin() error {
	return p.send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_CloseStdin{CloseStdin: true}})
}

// Signal delivers sig to the process (not its children).
func (p *Proc) Signal(sig syscall.Signal) error {
	return p.send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Signal{Signal: int32(sig)}})
}

// Resize sets the size of the process's PTY (TTY execs).
func (p *Proc) Resize(rows, cols int) error {
	return p.send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Resize{Resize: &agentpb.TTYSize{Rows: uint32(rows), Cols: uint32(cols)}}})
}

// Kill kills the whole process tree at once.
func (p *Proc) Kill() error {
	return p.send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Kill{Kill: true}})
}

// Done is closed when the process has ended and its output was delivered,
// or the call failed.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait blocks until the process has ended and all output was written.
func (p *Proc) Wait() (Exit, error) {
	<-p.done
	return p.exit, p.err
}
