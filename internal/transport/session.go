package transport

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Window sizes for gRPC streams over yamux. Setting them explicitly turns
// off gRPC's dynamic (BDP) window growth, so a caller that stops reading an
// exec's output holds at most about this much data in host memory before
// the guest process blocks on its pipe.
const (
	streamWindow = 1 << 20
	connWindow   = 4 << 20
)

func yamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 15 * time.Second
	// Under TCG a busy guest can stall for seconds; do not call that dead.
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	return c
}

// Client is a host-side agent connection: a yamux session over one
// handshaken byte stream, and a gRPC client connection whose transports are
// yamux streams.
type Client struct {
	Session      *yamux.Session
	Conn         *grpc.ClientConn
	AgentVersion string
}

// NewClient performs the host handshake on conn (giving up at deadline),
// starts yamux and returns a gRPC connection over it. Closing the Client
// closes conn.
func NewClient(conn net.Conn, deadline time.Time) (*Client, error) {
	ver, err := HostHandshake(conn, deadline)
	if err != nil {
		conn.Close()
		return nil, err
	}
	sess, err := yamux.Client(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return nil, err
	}
	cc, err := grpc.NewClient("passthrough:///airlock-agent",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return sess.Open()
		}),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
	)
	if err != nil {
		sess.Close()
		return nil, err
	}
	return &Client{Session: sess, Conn: cc, AgentVersion: ver}, nil
}

// Close tears down the gRPC connection and the session.
func (c *Client) Close() error {
	c.Conn.Close()
	return c.Session.Close()
}

// Done is closed when the underlying session has ended (peer gone, VM dead,
// or Close).
func (c *Client) Done() <-chan struct{} { return c.Session.CloseChan() }

// ServerOptions are the gRPC server options that match the client's window
// sizes.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
	}
}

// Serve runs the guest side on one handshaken byte stream: it starts a yamux
// server session on rwc and serves srv on it until the session ends. It
// closes rwc before returning.
func Serve(rwc io.ReadWriteCloser, srv *grpc.Server) error {
	sess, err := yamux.Server(rwc, yamuxConfig())
	if err != nil {
		rwc.Close()
		return err
	}
	defer sess.Close()
	err = srv.Serve(sess)
	return err
}
