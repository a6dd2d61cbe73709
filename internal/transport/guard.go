package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// ErrHostileAgent is the cause of a session the host cut off because the
// guest broke a limit no real agent comes near (Client.Err wraps it): code
// in the box may have replaced the agent.
var ErrHostileAgent = errors.New("the guest agent broke the protocol's limits")

// Inbound yamux ping frames (requests and replies) the host accepts: a
// burst of pingBurst, then pingRate a second. A real agent sends about one
// every 2 s (the replies to the host's keepalive) plus its own keepalive
// every 15 s. yamux v0.1.2 starts a goroutine for every ping request it
// reads, which waits up to its write timeout (30 s) to send the reply: an
// unbounded flood would grow the host's memory without bound, so a guest
// past these limits is cut off. The most goroutines a guest can keep
// waiting is then about pingBurst + pingRate x 30.
const (
	pingBurst = 32
	pingRate  = 4
)

// yamux frame header (spec.md of hashicorp/yamux): version, type, flags,
// stream id, length; a data frame's length bytes of payload follow it.
const (
	yamuxHeader   = 12
	yamuxTypeData = 0
	yamuxTypePing = 2
	yamuxFlagSYN  = 1
)

// guardConn is the host's side of an agent connection below yamux: it
// follows the yamux frames it reads and ends the connection with an
// ErrHostileAgent error when the guest floods pings.
type guardConn struct {
	net.Conn

	hdr  [yamuxHeader]byte
	hn   int    // bytes of hdr read so far
	skip uint32 // payload bytes of the current data frame still to pass

	tokens float64
	last   time.Time

	mu  sync.Mutex
	err error // why the guard cut the connection
}

func newGuardConn(c net.Conn) *guardConn {
	return &guardConn{Conn: c, tokens: pingBurst, last: time.Now()}
}

// Read passes the guest's bytes to yamux, counting its ping frames.
func (g *guardConn) Read(p []byte) (int, error) {
	if err := g.cutErr(); err != nil {
		return 0, err
	}
	n, err := g.Conn.Read(p)
	if ferr := g.scan(p[:n]); ferr != nil {
		g.cut(ferr)
		return 0, ferr
	}
	return n, err
}

// scan follows the frame boundaries in b.
func (g *guardConn) scan(b []byte) error {
	for len(b) > 0 {
		if g.skip > 0 {
			k := uint32(len(b))
			if k > g.skip {
				k = g.skip
			}
			g.skip -= k
			b = b[k:]
			continue
		}
		k := copy(g.hdr[g.hn:], b)
		g.hn += k
		b = b[k:]
		if g.hn < yamuxHeader {
			return nil
		}
		g.hn = 0
		switch g.hdr[1] {
		case yamuxTypeData:
			g.skip = binary.BigEndian.Uint32(g.hdr[8:12])
		case yamuxTypePing:
			// Only a ping request (SYN) makes yamux start a goroutine
			// that answers it; answers to the host's own pings are a
			// map lookup, and a box unpaused after a long pause sends
			// a backlog of them at once.
			if binary.BigEndian.Uint16(g.hdr[2:4])&yamuxFlagSYN == 0 {
				continue
			}
			if err := g.ping(); err != nil {
				return err
			}
		}
	}
	return nil
}

// ping takes a token for one inbound ping request.
func (g *guardConn) ping() error {
	now := time.Now()
	g.tokens = min(pingBurst, g.tokens+now.Sub(g.last).Seconds()*pingRate)
	g.last = now
	if g.tokens < 1 {
		return fmt.Errorf("%w: it sent more than %d pings at once (%d a second allowed): connection cut off (stop the box: code in it may have replaced its agent)", ErrHostileAgent, pingBurst, pingRate)
	}
	g.tokens--
	return nil
}

func (g *guardConn) cut(err error) {
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	g.mu.Unlock()
	g.Conn.Close()
}

// cutErr is why the guard cut the connection, or nil.
func (g *guardConn) cutErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}
