package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// text is a test message: its encoding is the string itself.
type text struct{ Value string }

func (t *text) AppendWire(b []byte) []byte   { return append(b, t.Value...) }
func (t *text) UnmarshalWire(b []byte) error { t.Value = string(b); return nil }

func textOf(s string) *text { return &text{s} }

// rpcPair serves h on a handshaken pipe and returns the host's client.
func rpcPair(t *testing.T, h Handler) *Client {
	t.Helper()
	host, guest := serialPipe(t)
	go func() {
		if GuestHandshake(guest, "test") == nil {
			Serve(guest, h)
		}
	}()
	c, err := NewClient(host, time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestUnaryCallAndErrors(t *testing.T) {
	c := rpcPair(t, func(method string, s *Stream) error {
		req := new(text)
		if err := s.Recv(req); err != nil {
			return err
		}
		switch method {
		case "Echo":
			return s.Send(textOf(strings.ToUpper(req.Value)))
		case "Fail":
			return errors.New("no such thing: " + req.Value)
		}
		return errors.New("unknown call " + method)
	})
	ctx := context.Background()
	reply := new(text)
	if err := c.Unary(ctx, "Echo", textOf("hi"), reply); err != nil || reply.Value != "HI" {
		t.Fatalf("Echo: %q %v", reply.Value, err)
	}
	err := c.Unary(ctx, "Fail", textOf("x"), reply)
	var re *RemoteError
	if !errors.As(err, &re) || re.Msg != "no such thing: x" || err.Error() != "agent Fail: no such thing: x" {
		t.Fatalf("Fail: %v", err)
	}
	// A bad frame from the host ends that call only; the session goes on.
	st, err := c.Session.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[:], MaxFrame+2)
	hdr[4] = frameCall
	st.Write(hdr[:])
	st.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := st.Read(make([]byte, 10)); err != io.EOF {
		t.Fatalf("oversized frame: read %d, %v; want the agent to close the stream", n, err)
	}
	st.Close()
	if err := c.Unary(ctx, "Echo", textOf("again"), reply); err != nil || reply.Value != "AGAIN" {
		t.Fatalf("Echo after a bad frame: %q %v", reply.Value, err)
	}
}

// Ending a call's context unblocks its Recv with the context's error, and
// the handler sees the stream end.
func TestCallCancel(t *testing.T) {
	ended := make(chan error, 1)
	c := rpcPair(t, func(method string, s *Stream) error {
		err := s.Recv(new(text))
		<-s.Context().Done()
		ended <- err
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.Call(ctx, "Wait")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make(chan error, 1)
	go func() { got <- s.Recv(new(text)) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-got:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Recv after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still blocked 5 s after cancel")
	}
	select {
	case err := <-ended:
		if err != io.EOF {
			t.Fatalf("handler's Recv: %v, want io.EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler did not see the call end")
	}
}

// stallConn stops reading once stall is closed (until done is): the
// peer's writes then fill the connection and block, as they do when a
// guest stops reading.
type stallConn struct {
	net.Conn
	stall, done chan struct{}
}

func (c *stallConn) Read(p []byte) (int, error) {
	select {
	case <-c.stall:
		<-c.done
		return 0, io.EOF
	default:
		return c.Conn.Read(p)
	}
}

// Closing a call's stream sends a frame; with a guest that reads nothing
// that frame waits (up to yamux's 30 s write timeout), but the caller
// returns when the call's context ends.
func TestCloseEndsWithTheCallsContext(t *testing.T) {
	host, guest := serialPipe(t)
	sg := &stallConn{Conn: guest, stall: make(chan struct{}), done: make(chan struct{})}
	go func() {
		if GuestHandshake(sg, "test") == nil {
			Serve(sg, func(method string, s *Stream) error {
				<-s.Context().Done()
				return nil
			})
		}
	}()
	c, err := NewClient(host, time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); close(sg.done) })
	// Calls opened while the guest still reads: each try below closes one.
	type call struct {
		s      *Stream
		cancel context.CancelFunc
	}
	var calls []call
	for i := 0; i < 60; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := c.Call(ctx, "Wait")
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		calls = append(calls, call{s, cancel})
	}
	t.Cleanup(func() {
		for _, w := range calls {
			w.cancel()
		}
	})
	// The guest stops reading; calls with no deadline fill the
	// connection (64 streams × yamux's 256 KiB first window is past any
	// loopback socket's buffers).
	close(sg.stall)
	big := textOf(strings.Repeat("x", 1<<20))
	for i := 0; i < 64; i++ {
		go func() {
			if f, err := c.Call(context.Background(), "Fill"); err == nil {
				f.Send(big)
			}
		}()
	}
	// How soon the fill blocks the connection depends on the machine's
	// load, so each try opens a call and closes it: a Close that returns
	// at once means the connection is not full yet (try again); one that
	// blocks shows the case, and must end when its call's context does.
	for i, w := range calls {
		closed := make(chan error, 1)
		go func() { closed <- w.s.Close() }()
		select {
		case err := <-closed:
			if i == len(calls)-1 {
				t.Fatalf("Close returned (%v) on every try while the guest read nothing: the connection was never filled, the test shows nothing", err)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		case <-time.After(300 * time.Millisecond):
		}
		w.cancel()
		select {
		case <-closed:
		case <-time.After(3 * time.Second):
			t.Fatal("Close still blocked 3 s after the call's context ended")
		}
		return
	}
}
