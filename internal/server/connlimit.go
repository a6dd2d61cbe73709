package server

import (
	"container/list"
	"context"
	"net"
	"sync"
)

// MaxUnauthenticatedConns bounds the connections of a token listener
// that have not yet made a request with the token (Serve): a connection
// accepted beyond it closes the one that has waited longest. They do not
// count against Config.MaxConns, so a peer without the token cannot hold
// the slots of the clients that have it.
const MaxUnauthenticatedConns = 64

// authLimitListener is a token listener's connection bound: at most max
// authenticated connections at once (Accept returns no connection while
// that many are open, as netutil.LimitListener does), and at most pendingMax not yet
// authenticated (the oldest is closed to make room). A connection counts
// as authenticated from its first request with the token (authenticated,
// called by Server.auth through the request's context).
type authLimitListener struct {
	net.Listener
	max, pendingMax int

	mu      sync.Mutex
	authed  int
	pending *list.List    // of *gatedConn, oldest at the front
	free    chan struct{} // signalled when an authenticated one closes
	done    chan struct{} // closed by Close
	once    sync.Once
}

func newAuthLimitListener(l net.Listener, max, pendingMax int) *authLimitListener {
	return &authLimitListener{Listener: l, max: max, pendingMax: pendingMax, pending: list.New(), free: make(chan struct{}, 1), done: make(chan struct{})}
}

// Close closes the listener and ends an Accept that waits for a slot.
func (l *authLimitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

func (l *authLimitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// Checked after the accept: a connection accepted earlier may have
	// become authenticated while this Accept waited.
	for {
		l.mu.Lock()
		full := l.authed >= l.max
		l.mu.Unlock()
		if !full {
			break
		}
		select {
		case <-l.free:
		case <-l.done:
			c.Close()
			return nil, net.ErrClosed
		}
	}
	g := &gatedConn{Conn: c, l: l}
	l.mu.Lock()
	g.el = l.pending.PushBack(g)
	var evict *gatedConn
	if l.pending.Len() > l.pendingMax {
		front := l.pending.Front()
		evict = front.Value.(*gatedConn)
		l.pending.Remove(front)
		evict.el = nil
	}
	l.mu.Unlock()
	if evict != nil {
		evict.Conn.Close() // its server goroutine sees the error and ends
	}
	return g, nil
}

// gatedConn is a connection of an authLimitListener.
type gatedConn struct {
	net.Conn
	l *authLimitListener
	// el is its place among the pending ones (nil once authenticated,
	// evicted or closed); authed says it holds an authenticated slot.
	// Both under l.mu.
	el     *list.Element
	authed bool
	closed bool
}

// authenticated moves c from the pending connections to the
// authenticated ones (once).
func (c *gatedConn) authenticated() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.el == nil || c.closed {
		return
	}
	c.l.pending.Remove(c.el)
	c.el = nil
	c.authed = true
	c.l.authed++
}

func (c *gatedConn) Close() error {
	c.l.mu.Lock()
	if !c.closed {
		c.closed = true
		if c.el != nil {
			c.l.pending.Remove(c.el)
			c.el = nil
		}
		if c.authed {
			c.l.authed--
			select {
			case c.l.free <- struct{}{}:
			default:
			}
		}
	}
	c.l.mu.Unlock()
	return c.Conn.Close()
}

type connKeyT struct{}

var connKey connKeyT

// withConn is http.Server.ConnContext: it puts the connection where
// Server.auth finds it.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey, c)
}

// markAuthenticated counts the connection of ctx (if it is a gated one)
// as authenticated.
func markAuthenticated(ctx context.Context) {
	if g, ok := ctx.Value(connKey).(*gatedConn); ok {
		g.authenticated()
	}
}
