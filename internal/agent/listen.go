//go:build linux

package agent

import (
	"container/list"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/transport"
)

// Bounds on the connections a listener of the agent holds (ServeListener).
// Any local user of the host can open vsock connections to a box (its CID
// shows in ps), and an unauthenticated connection costs the guest a
// goroutine and socket buffers until it completes the handshake or ends.
const (
	// MaxPendingHandshakes is how many connections may be in the
	// handshake at once without having shown the host's SYNC ticket
	// (transport.SyncTicket). A connection accepted beyond it ends one
	// of them: the longest waiting of those that sent a SYNC without a
	// valid ticket, else the longest waiting of those that sent none
	// yet. A host sends its ticketed SYNC as soon as it connects, so a
	// flood has to fill this many places in that time to push it out.
	// Each costs the guest a goroutine and a socket (~10 KiB).
	MaxPendingHandshakes = 128
	// MaxVouchedHandshakes is how many connections that showed a valid
	// ticket may be in the handshake at once; they are not closed for
	// room (past this bound a ticketed one is treated as any other).
	MaxVouchedHandshakes = 16
	// HandshakeTimeout is how long a connection may take to complete the
	// handshake before the agent closes it.
	HandshakeTimeout = 10 * time.Second
	// MaxSessions is how many authenticated sessions a listener serves at
	// once; a connection accepted while that many are served is closed at
	// once (the host then uses a virtio-serial port).
	MaxSessions = 128
)

// ListenLimits are the bounds ServeListener keeps; a zero field takes its
// default (MaxPendingHandshakes, HandshakeTimeout, MaxSessions, and
// MaxVouchedHandshakes).
type ListenLimits struct {
	Pending          int
	HandshakeTimeout time.Duration
	Sessions         int
	Vouched          int
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
	if l.Vouched <= 0 {
		l.Vouched = MaxVouchedHandshakes
	}
	return l
}

// ServeListener accepts connections on l, runs the guest side of the
// handshake on each (transport.GuestHandshakeVouch with key) and serves
// the sessions of the hosts that pass it with h, within lim (see
// ListenLimits): at most lim.Pending connections wait in the handshake
// without the host's SYNC ticket (one of them is closed to make room for
// a new one, see MaxPendingHandshakes) and lim.Vouched with it, each for
// at most lim.HandshakeTimeout, and at most lim.Sessions sessions run.
// It returns once l is closed (net.ErrClosed); other accept errors are
// retried after 100 ms.
func ServeListener(l net.Listener, key transport.GuestKey, h transport.Handler, lim ListenLimits) error {
	lim = lim.withDefaults()
	g := &gate{lim: lim, fresh: list.New(), judged: list.New()}
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
		// A host sends its SYNC as soon as it connects: under a flood,
		// it is there by the time the agent accepts the connection, and
		// the connection is filed by it before any other can push it out.
		secret, _ := key.Current()
		synced, ticketed := transport.SyncTicketed(peekNow(c), secret)
		p, ok := g.admit(c, synced, ticketed)
		if !ok {
			c.Close()
			continue
		}
		go g.serve(p, key, h)
	}
}

// gate keeps a listener's pending handshakes and counts its sessions.
type gate struct {
	lim ListenLimits
	mu  sync.Mutex
	// fresh are the pending connections that sent no SYNC yet, judged
	// those that sent one without a valid ticket (oldest at the front
	// of each); vouched counts those that showed a valid ticket.
	fresh, judged *list.List // of *pendingConn
	vouched       int
	sessions      int
}

// pendingConn is a connection in the handshake.
type pendingConn struct {
	c net.Conn
	// Under gate.mu: its place in fresh or judged (nil when in
	// neither); vouched while it counts in gate.vouched; closed once
	// closed for room.
	el      *list.Element
	in      *list.List
	vouched bool
	closed  bool
}

func (g *gate) pendingLen() int { return g.fresh.Len() + g.judged.Len() }

// admit puts c among the pending handshakes (filed as synced would,
// when it has sent a SYNC line already), closing one pending connection
// without a ticket when they are full (the oldest judged, else the
// oldest fresh); ok is false when the sessions are full.
func (g *gate) admit(c net.Conn, synced, ticketed bool) (*pendingConn, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sessions >= g.lim.Sessions {
		return nil, false
	}
	for g.pendingLen() >= g.lim.Pending {
		from := g.judged
		if from.Len() == 0 {
			from = g.fresh
		}
		old := from.Front().Value.(*pendingConn)
		g.unlist(old)
		old.closed = true
		old.c.Close() // its handshake fails and its goroutine ends
	}
	p := &pendingConn{c: c, in: g.fresh}
	p.el = g.fresh.PushBack(p)
	if synced {
		g.file(p, ticketed)
	}
	return p, true
}

// peekNow returns the bytes c has received so far (at most 512), without
// consuming them or waiting.
func peekNow(c net.Conn) []byte {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	var buf [512]byte
	n := 0
	rc.Read(func(fd uintptr) bool {
		m, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err == nil && m > 0 {
			n = m
		}
		return true // never wait
	})
	return buf[:n]
}

func (g *gate) unlist(p *pendingConn) {
	if p.el != nil {
		p.in.Remove(p.el)
		p.el, p.in = nil, nil
	}
}

// synced files p by its first SYNC: vouched (not closed for room, while
// fewer than lim.Vouched are) when it carried a valid ticket, else judged.
func (g *gate) synced(p *pendingConn, ticketed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.file(p, ticketed)
}

// file is synced with g.mu held.
func (g *gate) file(p *pendingConn, ticketed bool) {
	if p.closed || p.vouched || p.in != g.fresh {
		return
	}
	g.unlist(p)
	if ticketed && g.vouched < g.lim.Vouched {
		p.vouched = true
		g.vouched++
		return
	}
	p.in = g.judged
	p.el = g.judged.PushBack(p)
}

// done takes p off the pending handshakes; handshaken (its handshake
// passed) counts its session, and false is returned when p was closed
// for room meanwhile or the sessions are full.
func (g *gate) done(p *pendingConn, handshaken bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.unlist(p)
	if p.vouched {
		p.vouched = false
		g.vouched--
	}
	if !handshaken || p.closed || g.sessions >= g.lim.Sessions {
		return false
	}
	g.sessions++
	return true
}

func (g *gate) serve(p *pendingConn, key transport.GuestKey, h transport.Handler) {
	c := p.c
	c.SetDeadline(time.Now().Add(g.lim.HandshakeTimeout))
	err := transport.GuestHandshakeVouch(c, Version, key, func(ticketed bool) { g.synced(p, ticketed) })
	if !g.done(p, err == nil) {
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
