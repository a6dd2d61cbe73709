//go:build linux

package agent

import (
	"container/list"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/transport"
)

// Bounds on the connections a listener of the agent holds (ServeListener).
// Any local user of the host can open vsock connections to a box (its CID
// shows in ps), and an unauthenticated connection costs the guest a
// goroutine and socket buffers until it completes the handshake or ends.
const (
	// MaxPendingHandshakes is how many connections may be in the
	// handshake at once. A connection accepted beyond it ends the one
	// that has waited longest (a host completes its handshake within
	// milliseconds; a connection that holds a slot idle is a stale or
	// hostile one).
	MaxPendingHandshakes = 8
	// HandshakeTimeout is how long a connection may take to complete the
	// handshake before the agent closes it.
	HandshakeTimeout = 10 * time.Second
	// MaxSessions is how many authenticated sessions a listener serves at
	// once; a connection accepted while that many are served is closed at
	// once (the host then uses a virtio-serial port).
	MaxSessions = 128
)

// ListenLimits are the bounds ServeListener keeps; a zero field takes its
// default (MaxPendingHandshakes, HandshakeTimeout, MaxSessions).
type ListenLimits struct {
	Pending          int
	HandshakeTimeout time.Duration
	Sessions         int
}

func (l ListenLimits) withDefaults() ListenLimits {
	if l.Pending <= 0 {
		l.Pending = MaxPendingHandshakes
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = HandshakeTimeout
	}
	if l.Sessions <= 0 {
		l.Sessions = MaxSessions
	}
	return l
}

// ServeListener accepts connections on l, runs the guest side of the
// handshake on each (transport.GuestHandshakeKey with key) and serves the
// sessions of the hosts that pass it with h, within lim (see
// ListenLimits): at most lim.Pending connections wait in the handshake
// (the longest waiting is closed to make room for a new one), each for
// at most lim.HandshakeTimeout, and at most lim.Sessions sessions run.
// It returns once l is closed (net.ErrClosed); other accept errors are
// retried after 100 ms.
func ServeListener(l net.Listener, key transport.GuestKey, h transport.Handler, lim ListenLimits) error {
	lim = lim.withDefaults()
	g := &gate{lim: lim, pending: list.New()}
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors or memory: retry, as the host may
			// connect again once the stale connections are gone.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		el, ok := g.admit(c)
		if !ok {
			c.Close()
			continue
		}
		go g.serve(c, el, key, h)
	}
}

// gate keeps a listener's pending handshakes (oldest first) and counts
// its sessions.
type gate struct {
	lim      ListenLimits
	mu       sync.Mutex
	pending  *list.List // of net.Conn, oldest at the front
	sessions int
}

// admit puts c among the pending handshakes, closing the oldest pending
// one when they are full; ok is false when the sessions are full.
func (g *gate) admit(c net.Conn) (*list.Element, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sessions >= g.lim.Sessions {
		return nil, false
	}
	for g.pending.Len() >= g.lim.Pending {
		front := g.pending.Front()
		old := front.Value.(net.Conn)
		g.pending.Remove(front)
		front.Value = nil // marks it closed for handshaken and drop
		old.Close()       // its handshake fails and its goroutine ends
	}
	return g.pending.PushBack(c), true
}

// handshaken takes c (el) off the pending list and counts its session;
// false when c was closed to make room meanwhile, or the sessions are full.
func (g *gate) handshaken(el *list.Element) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if el.Value == nil {
		return false
	}
	g.pending.Remove(el)
	el.Value = nil
	if g.sessions >= g.lim.Sessions {
		return false
	}
	g.sessions++
	return true
}

// drop takes el off the pending list if it is still there.
func (g *gate) drop(el *list.Element) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if el.Value != nil {
		g.pending.Remove(el)
		el.Value = nil
	}
}

func (g *gate) serve(c net.Conn, el *list.Element, key transport.GuestKey, h transport.Handler) {
	c.SetDeadline(time.Now().Add(g.lim.HandshakeTimeout))
	if err := transport.GuestHandshakeKey(c, Version, key); err != nil {
		g.drop(el)
		c.Close()
		return
	}
	if !g.handshaken(el) {
		c.Close()
		return
	}
	defer func() {
		g.mu.Lock()
		g.sessions--
		g.mu.Unlock()
	}()
	c.SetDeadline(time.Time{})
	transport.Serve(c, h)
}
