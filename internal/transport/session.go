package transport

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// Keepalives on the host's session: every KeepAliveInterval the host pings
// the agent; a ping not answered within KeepAliveTimeout ends the session
// (every call in flight fails with ErrAgentUnresponsive's text), so a dead
// or wedged guest is noticed within about 10 s even by a call that waits
// on nothing else (an exec without a timeout). The agent's yamux answers
// pings on its own goroutines, so a busy box is not mistaken for a dead one.
const (
	KeepAliveInterval = 2 * time.Second
	KeepAliveTimeout  = 8 * time.Second
)

// Client is a host-side agent connection: a yamux session over one
// handshaken byte stream; each call (Call, Unary) is a yamux stream.
type Client struct {
	Session      *yamux.Session
	AgentVersion string

	guard *guardConn // the connection below yamux

	mu      sync.Mutex
	err     error                    // why the session was ended by keepalive
	stalled func(time.Duration) bool // SetStalled
}

// NewClient performs the host handshake on conn (giving up at deadline) and
// starts yamux. Closing the Client closes conn. Streams the guest opens are
// refused (reset) at once: the host serves nothing to the guest, and a
// guest must not be able to park buffers in host memory.
func NewClient(conn net.Conn, deadline time.Time) (*Client, error) {
	return NewClientAuth(conn, deadline, nil)
}

// NewClientAuth is NewClient proving knowledge of the box secret in the
// handshake (see HostHandshakeAuth).
func NewClientAuth(conn net.Conn, deadline time.Time, secret []byte) (*Client, error) {
	ver, err := HostHandshakeAuth(conn, deadline, secret)
	if err != nil {
		conn.Close()
		return nil, err
	}
	cfg := yamuxConfig()
	cfg.EnableKeepAlive = false // keepalive below, with its own timeout
	// The guard bounds what the guest can make yamux do for it (pings).
	guard := newGuardConn(conn)
	sess, err := yamux.Client(guard, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	// GoAway makes yamux reset every stream the guest opens from now on,
	// before allocating anything for it.
	if err := sess.GoAway(); err != nil {
		sess.Close()
		if gerr := guard.cutErr(); gerr != nil {
			return nil, gerr
		}
		return nil, err
	}
	c := &Client{Session: sess, AgentVersion: ver, guard: guard}
	go c.keepalive(KeepAliveInterval, KeepAliveTimeout)
	return c, nil
}

func (c *Client) keepalive(interval, timeout time.Duration) {
	done := c.Session.CloseChan()
	for {
		select {
		case <-done:
			return
		case <-time.After(interval):
		}
		pong := make(chan error, 1)
		sent := time.Now()
		go func() {
			_, err := c.Session.Ping()
			pong <- err
		}()
		timer := time.After(timeout)
	wait:
		for {
			select {
			case <-done:
				return
			case err := <-pong:
				if err != nil {
					if c.stalledNow(time.Since(sent)) {
						break wait // ping again
					}
					c.fail(fmt.Errorf("%w: keepalive ping failed: %v", ErrAgentUnresponsive, err))
					return
				}
				break wait
			case <-timer:
				if c.stalledNow(time.Since(sent)) {
					timer = time.After(timeout)
					continue
				}
				c.fail(fmt.Errorf("%w: no answer to a keepalive ping within %s", ErrAgentUnresponsive, time.Since(sent).Round(time.Second)))
				return
			}
		}
	}
}

// SetStalled gives the keepalive a test of a peer that cannot answer for
// now but is not dead (a paused VM: its vCPUs are stopped; a running one
// slowed down): while f returns true an unanswered ping does not end the
// session. f is called, with how long the ping has been unanswered, each
// time a ping went unanswered for another KeepAliveTimeout; nil removes
// it.
func (c *Client) SetStalled(f func(unanswered time.Duration) bool) {
	c.mu.Lock()
	c.stalled = f
	c.mu.Unlock()
}

func (c *Client) stalledNow(unanswered time.Duration) bool {
	c.mu.Lock()
	f := c.stalled
	c.mu.Unlock()
	return f != nil && f(unanswered)
}

func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.Session.Close()
}

// Err returns why the host ended the session: the agent stopped answering
// keepalive pings (it wraps ErrAgentUnresponsive) or broke the protocol's
// limits (ErrHostileAgent); nil otherwise.
func (c *Client) Err() error {
	if err := c.guard.cutErr(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the session: calls in flight fail and the agent kills the
// processes they started.
func (c *Client) Close() error { return c.Session.Close() }

// Done is closed when the underlying session has ended (peer gone, VM dead,
// or Close).
func (c *Client) Done() <-chan struct{} { return c.Session.CloseChan() }
