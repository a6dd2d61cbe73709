package transport

import (
	"net"
	"time"

	"github.com/hashicorp/yamux"
)

// Client is a host-side agent connection: a yamux session over one
// handshaken byte stream; each call (Call, Unary) is a yamux stream.
type Client struct {
	Session      *yamux.Session
	AgentVersion string
}

// NewClient performs the host handshake on conn (giving up at deadline) and
// starts yamux. Closing the Client closes conn.
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
	sess, err := yamux.Client(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &Client{Session: sess, AgentVersion: ver}, nil
}

// Close ends the session: calls in flight fail and the agent kills the
// processes they started.
func (c *Client) Close() error { return c.Session.Close() }

// Done is closed when the underlying session has ended (peer gone, VM dead,
// or Close).
func (c *Client) Done() <-chan struct{} { return c.Session.CloseChan() }
