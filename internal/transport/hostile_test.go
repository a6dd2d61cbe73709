package transport

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// A guest that opens streams to the host gets each one reset at once (or,
// once the host's go-away has arrived, its yamux refuses to open them); the
// host's own calls keep working.
func TestGuestOpenedStreamsAreRefused(t *testing.T) {
	host, guest := serialPipe(t)
	sessCh := make(chan *yamux.Session, 1)
	go func() {
		if GuestHandshake(guest, "test") != nil {
			return
		}
		sess, err := yamux.Server(guest, yamuxConfig())
		if err != nil {
			return
		}
		sessCh <- sess
		for {
			st, err := sess.AcceptStream()
			if err != nil {
				return
			}
			go serveStream(sess, st, func(method string, s *Stream) error {
				req := new(text)
				if err := s.Recv(req); err != nil {
					return err
				}
				return s.Send(req)
			})
		}
	}()
	c, err := NewClient(host, time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gs := <-sessCh
	for i := 0; i < 300; i++ { // more than yamux's accept backlog of 256
		st, err := gs.OpenStream()
		if errors.Is(err, yamux.ErrRemoteGoAway) {
			continue // the host's go-away arrived: the guest's yamux refuses itself
		}
		if err != nil {
			t.Fatalf("stream %d: open: %v", i, err)
		}
		st.Write(make([]byte, 64<<10))
		st.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = st.Read(make([]byte, 1))
		if !errors.Is(err, yamux.ErrConnectionReset) && !errors.Is(err, yamux.ErrStreamClosed) && err != io.EOF {
			t.Fatalf("stream %d opened by the guest: read gave %v, want a reset", i, err)
		}
		st.Close()
	}
	if n := c.Session.NumStreams(); n != 0 {
		t.Errorf("host holds %d guest-opened streams", n)
	}
	reply := new(text)
	if err := c.Unary(context.Background(), "Echo", textOf("still here"), reply); err != nil || reply.Value != "still here" {
		t.Fatalf("host call after the guest's streams: %q %v", reply.Value, err)
	}
}

// A guest that stops answering (here: stops reading its end, as a frozen
// VM does) is noticed by keepalive: the session ends within
// KeepAliveInterval+KeepAliveTimeout and Err says why.
func TestKeepaliveEndsSessionWithDeadAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("takes ~10 s")
	}
	host, guest := serialPipe(t)
	go GuestHandshake(guest, "test") // then never reads again
	c, err := NewClient(host, time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	select {
	case <-c.Done():
	case <-time.After(KeepAliveInterval + KeepAliveTimeout + 5*time.Second):
		t.Fatal("session still open with a dead agent")
	}
	if !errors.Is(c.Err(), ErrAgentUnresponsive) {
		t.Fatalf("Err = %v, want ErrAgentUnresponsive", c.Err())
	}
	t.Logf("dead agent noticed after %s", time.Since(t0).Round(time.Millisecond))
}

// A peer that cannot answer for now (a paused VM, SetStalled) keeps its
// session past the keepalive timeout; once it is no longer stalled and
// still does not answer, keepalive ends the session as usual. (Without
// SetStalled a pause of ~10 s ended the connection, and the follower of a
// box's main command then stopped the box.) The test is told how long the
// ping has gone unanswered: a slow peer's grace is a span of that.
func TestKeepaliveSparesStalledPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("takes ~20 s")
	}
	host, guest := serialPipe(t)
	go GuestHandshake(guest, "test") // then never reads again
	c, err := NewClient(host, time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var stalled atomic.Bool
	stalled.Store(true)
	var mu sync.Mutex
	var seen []time.Duration
	c.SetStalled(func(unanswered time.Duration) bool {
		mu.Lock()
		seen = append(seen, unanswered)
		mu.Unlock()
		return stalled.Load()
	})
	select {
	case <-c.Done():
		t.Fatalf("session of a stalled peer ended: %v", c.Err())
	case <-time.After(KeepAliveInterval + 2*KeepAliveTimeout + 2*time.Second):
	}
	stalled.Store(false)
	select {
	case <-c.Done():
	case <-time.After(KeepAliveTimeout + 3*time.Second):
		t.Fatal("session still open with a peer that no longer answers and is not stalled")
	}
	if !errors.Is(c.Err(), ErrAgentUnresponsive) {
		t.Fatalf("Err = %v, want ErrAgentUnresponsive", c.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	// One ping stays unanswered throughout: each call is told a longer
	// time, each at least KeepAliveTimeout more than the one before.
	if len(seen) < 3 || seen[0] < KeepAliveTimeout {
		t.Fatalf("stalled test told %v, want 3 or more times from %s on", seen, KeepAliveTimeout)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i]-seen[i-1] < KeepAliveTimeout-time.Second {
			t.Fatalf("stalled test told %v: not one ping unanswered for longer each time", seen)
		}
	}
}
