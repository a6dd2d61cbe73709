// Package evilagent plays a hostile guest agent, for tests of the host:
// root in a box can kill airlock-agent and speak the agent protocol on its
// port itself (the handshake proves the host to the guest, never the guest
// to the host), so everything the host reads from an agent is hostile
// input. An Agent completes the real handshake (internal/transport) and
// then answers the host's calls with what a test scripts: oversized or
// malformed frames, tar streams with entries outside their top, listings of
// huge names, endless output, half-closed streams, never an answer; or it
// takes over the raw connection below yamux (ping floods, frames for
// streams that do not exist).
//
// On the fake driver (internal/vmm/fake, Driver.TestAgent = Agent.Dial)
// the whole host stack (airlock.Box's calls) runs against it, with the real
// agent process still standing for the machine: calls a test does not
// script are passed on to that real agent. Its command evilguest runs it
// inside a real box, in the real agent's place
// (TestHostileGuestTakesOverAgent in package airlock).
package evilagent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/transport"
)

// Frame kinds of the agent protocol (docs/agent-protocol.md): each frame
// on a call's stream is a uint32 big-endian length (of kind + payload), a
// kind byte and the payload.
const (
	FrameCall  byte = 1 // host -> agent, first frame: the method name
	FrameMsg   byte = 2 // a protobuf message
	FrameError byte = 3 // agent -> host, last frame: the call failed
)

// Script answers one call. It returns when it is done with the call; the
// stream is closed then (an error is only logged, not sent).
type Script func(c *Call) error

// Agent is a scripted guest agent. Set its fields before the first
// connection.
type Agent struct {
	// Version is announced in the handshake; "" is agentpb.Version.
	Version string
	// Secret, when set, is the box secret the host must prove, as a real
	// agent checks it (transport.GuestHandshakeAuth).
	Secret []byte
	// Calls answers the calls it names. Other calls go to the real agent
	// where there is one (Dial's real), else Hello and Shutdown are
	// answered as a real agent does and the rest fail as unknown calls.
	Calls map[string]Script
	// Raw, when set, takes over each connection right after the handshake,
	// below yamux: the host's yamux session reads what it writes.
	Raw func(conn net.Conn) error
	// OnShutdown, when set, runs on an unscripted Shutdown call without a
	// real agent (in a VM: power off).
	OnShutdown func()
	// Log, when set, receives what the agent did (for test logs).
	Log func(format string, args ...any)

	mu    sync.Mutex
	conns []net.Conn
	seen  []string
}

func (a *Agent) logf(format string, args ...any) {
	if a.Log != nil {
		a.Log(format, args...)
	}
}

// SetCall scripts method (nil: no script) from now on; safe while the
// agent serves.
func (a *Agent) SetCall(method string, s Script) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.Calls == nil {
		a.Calls = map[string]Script{}
	}
	a.Calls[method] = s
}

// SetRaw sets Raw for the connections from now on; safe while the agent
// serves.
func (a *Agent) SetRaw(raw func(conn net.Conn) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.Raw = raw
}

// Seen returns the methods the host called, in order.
func (a *Agent) Seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.seen...)
}

// Close ends every connection the agent serves.
func (a *Agent) Close() {
	a.mu.Lock()
	conns := a.conns
	a.conns = nil
	a.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Dial is the fake driver's TestAgent hook: it returns the host's end of a
// new connection (a unix socket pair) and serves the other end as the
// agent; calls the agent has no script for go to the agent real dials.
func (a *Agent) Dial(ctx context.Context, boxID string, real func(context.Context) (net.Conn, error)) (net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	host, err := fileConn(fds[0], "evilagent-host")
	if err != nil {
		syscall.Close(fds[1])
		return nil, err
	}
	guest, err := fileConn(fds[1], "evilagent-guest")
	if err != nil {
		host.Close()
		return nil, err
	}
	go a.Serve(guest, real)
	return host, nil
}

func fileConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	return net.FileConn(f)
}

// Serve runs the agent on conn (the guest's end of one host connection)
// until it ends; real, when not nil, reaches the real agent for calls
// without a script. It closes conn.
func (a *Agent) Serve(conn net.Conn, real func(context.Context) (net.Conn, error)) error {
	a.mu.Lock()
	a.conns = append(a.conns, conn)
	raw := a.Raw
	a.mu.Unlock()
	defer conn.Close()
	ver := a.Version
	if ver == "" {
		ver = agentpb.Version
	}
	if err := transport.GuestHandshakeAuth(conn, ver, a.Secret); err != nil {
		a.logf("evilagent: handshake: %v", err)
		return err
	}
	if raw != nil {
		return raw(conn)
	}
	return a.session(conn, real)
}

// ServePort runs one handshake and session on a virtio-serial port f (in
// a guest), leaving f open for the next host: ending the session sets f's
// deadline to now (a read in progress ends), and the next ServePort clears
// it. While no host is connected, a read of the port ends at once: the
// caller retries after a pause.
func (a *Agent) ServePort(f *os.File) error {
	if err := f.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("the port takes no deadline: %w", err)
	}
	ver := a.Version
	if ver == "" {
		ver = agentpb.Version
	}
	if err := transport.GuestHandshakeAuth(f, ver, a.Secret); err != nil {
		return err
	}
	a.mu.Lock()
	raw := a.Raw
	a.mu.Unlock()
	if raw != nil {
		return raw(portConn{f})
	}
	return a.session(portSession{f}, nil)
}

// portSession is a port as one session's connection: Close ends the
// session's reads and writes but leaves the port open.
type portSession struct{ *os.File }

func (p portSession) Close() error { return p.SetDeadline(time.Now()) }

// portConn is a port as a net.Conn, for Raw scripts: Close ends its use
// as portSession's does.
type portConn struct{ *os.File }

func (p portConn) Close() error         { return p.SetDeadline(time.Now()) }
func (p portConn) LocalAddr() net.Addr  { return portAddr(p.Name()) }
func (p portConn) RemoteAddr() net.Addr { return portAddr("host") }

type portAddr string

func (a portAddr) Network() string { return "virtio-serial" }
func (a portAddr) String() string  { return string(a) }

// session serves one yamux session on conn.
func (a *Agent) session(conn io.ReadWriteCloser, real func(context.Context) (net.Conn, error)) error {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.EnableKeepAlive = false
	sess, err := yamux.Server(conn, cfg)
	if err != nil {
		return err
	}
	defer sess.Close()
	var px *proxy
	if real != nil {
		px = &proxy{dial: real}
		defer px.close()
	}
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return err
		}
		go a.serveStream(st, px)
	}
}

func (a *Agent) serveStream(st *yamux.Stream, px *proxy) {
	defer st.Close()
	c := &Call{St: st}
	kind, p, err := c.ReadFrame()
	if err != nil || kind != FrameCall {
		return
	}
	c.Method = string(p)
	a.mu.Lock()
	a.seen = append(a.seen, c.Method)
	s := a.Calls[c.Method]
	a.mu.Unlock()
	if s != nil {
		if err := s(c); err != nil {
			a.logf("evilagent: %s: %v", c.Method, err)
		}
		return
	}
	if px != nil {
		if err := px.pass(st, p); err != nil {
			a.logf("evilagent: %s passed on: %v", c.Method, err)
		}
		return
	}
	switch c.Method {
	case agentpb.MethodHello:
		if c.Recv(new(agentpb.HelloRequest)) == nil {
			c.Send(&agentpb.HelloResponse{Version: agentpb.Version, Kernel: "evil"})
		}
	case agentpb.MethodShutdown:
		if c.Recv(new(agentpb.ShutdownRequest)) == nil {
			c.Send(&agentpb.ShutdownResponse{})
			if a.OnShutdown != nil {
				a.OnShutdown()
			}
		}
	default:
		c.Error("unknown call " + c.Method)
	}
}

// proxy passes calls on to the real agent over one session of its own.
type proxy struct {
	dial func(context.Context) (net.Conn, error)
	mu   sync.Mutex
	c    *transport.Client
}

func (p *proxy) session() (*transport.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c != nil {
		return p.c, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := p.dial(ctx)
	if err != nil {
		return nil, err
	}
	c, err := transport.NewClient(conn, time.Now().Add(10*time.Second))
	if err != nil {
		return nil, err
	}
	p.c = c
	return c, nil
}

func (p *proxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c != nil {
		p.c.Close()
	}
}

// pass forwards the call named method on st to the real agent, both ways,
// until either end closes it.
func (p *proxy) pass(st *yamux.Stream, method []byte) error {
	c, err := p.session()
	if err != nil {
		return err
	}
	rs, err := c.Session.OpenStream()
	if err != nil {
		return err
	}
	defer rs.Close()
	if _, err := rs.Write(frame(FrameCall, method)); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		io.Copy(rs, st) // host -> agent; ends when the host abandons
		rs.Close()
		close(done)
	}()
	_, err = io.Copy(st, rs) // agent -> host; ends when the agent is done
	st.Close()
	rs.Close()
	return err
}

// frame encodes one agent protocol frame.
func frame(kind byte, payload []byte) []byte {
	b := make([]byte, 5, 5+len(payload))
	binary.BigEndian.PutUint32(b, uint32(len(payload)+1))
	b[4] = kind
	return append(b, payload...)
}

// Call is one call the host made, for a Script to answer.
type Call struct {
	Method string
	// St is the call's yamux stream: a script may write any bytes to it
	// (Write), half-close it (Close: the host reads the end of the call)
	// or leave it unanswered.
	St *yamux.Stream
}

// ReadFrame reads one frame from the host (at most transport.MaxFrame).
func (c *Call) ReadFrame() (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(c.St, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[:4])
	if n == 0 || n-1 > transport.MaxFrame {
		return 0, nil, fmt.Errorf("bad frame length %d", n)
	}
	p := make([]byte, n-1)
	if _, err := io.ReadFull(c.St, p); err != nil {
		return 0, nil, err
	}
	return h[4], p, nil
}

// Recv reads the host's next message into m.
func (c *Call) Recv(m transport.Message) error {
	kind, p, err := c.ReadFrame()
	if err != nil {
		return err
	}
	if kind != FrameMsg {
		return fmt.Errorf("frame kind %d, want a message", kind)
	}
	return m.UnmarshalWire(p)
}

// FileRequest reads a file call's request (its first message).
func (c *Call) FileRequest() (*agentpb.FileRequest, error) {
	m := new(agentpb.FileUp)
	if err := c.Recv(m); err != nil {
		return nil, err
	}
	r, ok := m.Msg.(*agentpb.FileUp_Request)
	if !ok || r.Request == nil {
		return nil, errors.New("first file call message is not a request")
	}
	return r.Request, nil
}

// Frame writes one frame of any kind and payload (no size check).
func (c *Call) Frame(kind byte, payload []byte) error {
	_, err := c.St.Write(frame(kind, payload))
	return err
}

// FrameHeader writes a frame header that announces length bytes (kind
// included) and nothing after it.
func (c *Call) FrameHeader(kind byte, length uint32) error {
	var h [5]byte
	binary.BigEndian.PutUint32(h[:4], length)
	h[4] = kind
	_, err := c.St.Write(h[:])
	return err
}

// Send writes one message.
func (c *Call) Send(m transport.Message) error { return c.Frame(FrameMsg, m.AppendWire(nil)) }

// Error fails the call with msg.
func (c *Call) Error(msg string) error { return c.Frame(FrameError, []byte(msg)) }

// Result sends a file call's result.
func (c *Call) Result(r *agentpb.FileResult) error {
	return c.Send(&agentpb.FileDown{Msg: &agentpb.FileDown_Result{Result: r}})
}

// Data sends a file call's data chunk.
func (c *Call) Data(b []byte) error {
	return c.Send(&agentpb.FileDown{Msg: &agentpb.FileDown_Data{Data: b}})
}

// Hang waits until the host abandons the call or the session ends,
// answering nothing.
func (c *Call) Hang() {
	io.Copy(io.Discard, c.St)
}

// yamux frame types and flags (hashicorp/yamux spec.md), for Raw scripts.
const (
	YamuxData         byte = 0
	YamuxWindowUpdate byte = 1
	YamuxPing         byte = 2
	YamuxGoAway       byte = 3

	YamuxSYN uint16 = 1
	YamuxACK uint16 = 2
	YamuxFIN uint16 = 4
	YamuxRST uint16 = 8
)

// YamuxHeader encodes one 12-byte yamux frame header.
func YamuxHeader(typ byte, flags uint16, stream, length uint32) []byte {
	h := make([]byte, 12)
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], stream)
	binary.BigEndian.PutUint32(h[8:12], length)
	return h
}

// PingFlood is a Raw script: it writes yamux ping requests to conn as
// fast as it can for d (or until the host cuts the connection) and answers
// the host's keepalive in advance with forged replies for the next ping
// ids, without reading anything the host sends. It returns the number of
// pings written.
func PingFlood(conn net.Conn, d time.Duration) (int, error) {
	// A batch: forged replies for the host's ping ids 0..63, then requests.
	var batch []byte
	for id := uint32(0); id < 64; id++ {
		batch = append(batch, YamuxHeader(YamuxPing, YamuxACK, 0, id)...)
	}
	for id := uint32(0); id < 1024; id++ {
		batch = append(batch, YamuxHeader(YamuxPing, YamuxSYN, 0, id)...)
	}
	n := 0
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write(batch); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue // the host does not read: try again
			}
			return n, err
		}
		n += 1024
	}
	return n, nil
}
