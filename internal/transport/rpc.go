package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// The agent's calls run on yamux streams, one stream per call. Each
// direction carries frames:
//
//	uint32 length (big endian, of kind + payload) | kind (1 byte) | payload
//
// The client's first frame is a call frame naming the method; then both
// sides send message frames (protobuf); the server may end the call with an
// error frame. Closing a stream ends the call: a client closes its side only
// when it abandons the call (the agent then kills what the call started),
// the server closes its side when the call is over.
const (
	frameCall  byte = 1 // client -> server, first frame: method name
	frameMsg   byte = 2 // a protobuf message
	frameError byte = 3 // server -> client, last frame: the call failed (UTF-8 text)
)

// MaxFrame is the largest frame payload in bytes (4 MiB). Larger frames are
// refused by both sides; exec output and stdin travel in smaller chunks.
const MaxFrame = 4 << 20

// streamWindow is each yamux stream's receive window: a caller that stops
// reading an exec's output holds at most about this much data in host
// memory before the guest process blocks on its pipe.
const streamWindow = 1 << 20

func yamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 15 * time.Second
	// Under TCG a busy guest can stall for seconds; do not call that dead.
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.MaxStreamWindowSize = streamWindow
	return c
}

// RemoteError is a call's failure as the agent reported it (an error
// frame).
type RemoteError struct {
	Method string // the call, e.g. "Exec"
	Msg    string // the agent's message
}

func (e *RemoteError) Error() string { return "agent " + e.Method + ": " + e.Msg }

// errStreamClosed is what Send returns after the peer abandoned the call.
var errStreamClosed = errors.New("agent protocol: the call was abandoned")

// Stream is one call: a yamux stream carrying frames. Send may be called
// from several goroutines; Recv from one at a time.
type Stream struct {
	st     *yamux.Stream
	method string
	ctx    context.Context
	cancel context.CancelFunc // ends ctx (server: peer gone or call over)
	stop   func() bool        // client: stops the ctx watcher
	wmu    sync.Mutex
	gone   bool // server: the client abandoned the call, guarded by wmu
	client bool // the host's side of a call (Client.Call)
	rhdr   [frameHeader]byte

	abortMu  sync.Mutex
	abortErr error // client: why the call was abandoned
}

// frameHeader is the length and kind before each frame's payload.
const frameHeader = 5

// newFrame returns a frame buffer of the given kind holding the header's
// room; the payload is appended to it.
func newFrame(kind byte, payloadCap int) []byte {
	buf := make([]byte, frameHeader, frameHeader+payloadCap)
	buf[4] = kind
	return buf
}

// writeFrame fills in buf's length and writes it (buf from newFrame, payload
// appended).
func (s *Stream) writeFrame(buf []byte) error {
	if n := len(buf) - frameHeader; n > MaxFrame {
		return fmt.Errorf("agent protocol: %s: frame of %d bytes exceeds %d", s.method, n, MaxFrame)
	}
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	if s.client {
		// A guest that stops reading blocks yamux's writes up to its
		// write timeout (30 s), whatever the call's context says: the
		// caller returns when the context ends, the write goes on alone
		// (its frame is its own) until it completes, times out or the
		// session ends.
		return waitCtx(s.ctx, func() error { return s.write(buf) })
	}
	return s.write(buf)
}

func (s *Stream) write(buf []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.gone {
		return errStreamClosed
	}
	_, err := s.st.Write(buf)
	return err
}

// waitCtx runs f and returns its error, or ctx's error as soon as ctx
// ends (f then finishes on its own).
func waitCtx(ctx context.Context, f func() error) error {
	if ctx.Done() == nil {
		return f()
	}
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Stream) readFrame() (byte, []byte, error) {
	return readFrame(s.st, &s.rhdr, s.method)
}

// readFrame reads one frame of call method from r into a new buffer,
// using hdr for its header. A frame past MaxFrame is an error before
// anything is allocated for it; the buffer grows with the payload that
// arrives (a peer that announces 4 MiB and sends nothing costs nothing).
func readFrame(r io.Reader, hdr *[frameHeader]byte, method string) (byte, []byte, error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			err = fmt.Errorf("agent protocol: %s: stream ended inside a frame", method)
		}
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n == 0 || n-1 > MaxFrame {
		return 0, nil, fmt.Errorf("agent protocol: %s: bad frame length %d", method, n)
	}
	p, err := readN(r, int(n-1))
	if err != nil {
		return 0, nil, fmt.Errorf("agent protocol: %s: stream ended inside a frame: %w", method, err)
	}
	return hdr[4], p, nil
}

// frameChunk is how much of a frame's payload is allocated ahead of the
// bytes that arrive: the agent's data chunks (256 KiB) fit in it, and the
// stream's window (streamWindow) is what a peer can send ahead anyway.
const frameChunk = streamWindow

// readN reads exactly n bytes from r, allocating as they arrive.
func readN(r io.Reader, n int) ([]byte, error) {
	if n <= frameChunk {
		p := make([]byte, n)
		_, err := io.ReadFull(r, p)
		return p, err
	}
	p := make([]byte, 0, frameChunk)
	for len(p) < n {
		if len(p) == cap(p) {
			p = append(p, 0)[:len(p)]
		}
		k, err := r.Read(p[len(p):min(cap(p), n)])
		p = p[:len(p)+k]
		if err != nil && len(p) < n {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return p, nil
}

// Message is a message of the agent protocol: it encodes itself in the
// protobuf wire format (agentpb's types).
type Message interface {
	// AppendWire appends the encoded message to b.
	AppendWire(b []byte) []byte
	// UnmarshalWire replaces the message with the one encoded in b, which
	// it may keep referring to.
	UnmarshalWire(b []byte) error
}

// Send writes one message.
func (s *Stream) Send(m Message) error {
	// Encoded straight into the frame: no copy of exec output chunks.
	return s.writeFrame(m.AppendWire(newFrame(frameMsg, 64)))
}

// Recv reads the next message into m. It returns io.EOF when the peer
// closed its side, a *RemoteError when the agent failed the call, and on a
// client stream whose context ended, that context's error.
func (s *Stream) Recv(m Message) error {
	// An abandoned call is over, even while replies are still buffered.
	if err := s.aborted(); err != nil {
		return err
	}
	kind, p, err := s.readFrame()
	if err != nil {
		if aerr := s.aborted(); aerr != nil {
			err = aerr
		}
		if s.cancel != nil {
			s.cancel()
		}
		return err
	}
	switch kind {
	case frameMsg:
		return m.UnmarshalWire(p)
	case frameError:
		return &RemoteError{Method: s.method, Msg: string(p)}
	}
	return fmt.Errorf("agent protocol: %s: unexpected frame kind %d", s.method, kind)
}

// Context is, on the agent's side, the call's context: it ends when the
// client abandons the call (Recv fails), the session ends or the handler
// returns. On the client's side it is the context the call was made with.
func (s *Stream) Context() context.Context { return s.ctx }

// Close ends the call. A client that closes before the last reply abandons
// the call.
func (s *Stream) Close() error {
	if s.stop != nil {
		s.stop()
	}
	if s.cancel != nil {
		s.cancel()
	}
	if s.client && s.ctx != nil && s.ctx.Done() != nil {
		// Closing sends a frame (see writeFrame): a guest that does not
		// read must not hold the caller past its call's context.
		err := waitCtx(s.ctx, s.st.Close)
		if s.ctx.Err() != nil {
			return nil
		}
		return err
	}
	return s.st.Close()
}

// WaitPeerClose waits, after Close, up to d for the peer to close its
// side of the call (its handler has returned), discarding what it still
// sends; it returns nil then, else the error that ended the wait.
func (s *Stream) WaitPeerClose(d time.Duration) error {
	if err := s.st.SetReadDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, s.st)
	return err
}

func (s *Stream) aborted() error {
	s.abortMu.Lock()
	defer s.abortMu.Unlock()
	return s.abortErr
}

// abort abandons a client call: a blocked Recv returns err at once, and
// the agent sees the stream end. The Recv is released first: closing the
// stream sends a frame, which waits (up to yamux's write timeout) while
// the guest does not read.
func (s *Stream) abort(err error) {
	s.abortMu.Lock()
	s.abortErr = err
	s.abortMu.Unlock()
	s.st.SetReadDeadline(time.Now())
	s.st.Close()
}

// Call starts method on the agent. Ending ctx abandons the call: a blocked
// Recv returns ctx's error and the agent ends what the call started (an exec
// is killed). The caller must Close the stream when done.
func (c *Client) Call(ctx context.Context, method string) (*Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Opening a stream sends a frame: see writeFrame.
	var st *yamux.Stream
	opened := make(chan struct{})
	err := waitCtx(ctx, func() error {
		defer close(opened)
		var err error
		st, err = c.Session.OpenStream()
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			go func() {
				<-opened
				if st != nil {
					st.Close()
				}
			}()
		}
		return nil, fmt.Errorf("agent %s: %w", method, err)
	}
	s := &Stream{st: st, method: method, ctx: ctx, client: true}
	if err := s.writeFrame(append(newFrame(frameCall, len(method)), method...)); err != nil {
		go st.Close()
		return nil, fmt.Errorf("agent %s: %w", method, err)
	}
	s.stop = context.AfterFunc(ctx, func() { s.abort(ctx.Err()) })
	return s, nil
}

// Unary makes a call with one request and one reply.
func (c *Client) Unary(ctx context.Context, method string, req, reply Message) error {
	s, err := c.Call(ctx, method)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Send(req); err != nil {
		return err
	}
	if err := s.Recv(reply); err != nil {
		if err == io.EOF {
			err = fmt.Errorf("agent %s: no reply (connection lost?)", method)
		}
		return err
	}
	return nil
}

// Handler serves one call on the agent's side: method is the name the
// client sent. A returned error is sent to the client as the call's error;
// the stream is closed when the handler returns.
type Handler func(method string, s *Stream) error

// Serve runs the guest side on one handshaken byte stream: it starts a yamux
// server session on rwc and serves each stream as a call with h until the
// session ends. It closes rwc before returning.
func Serve(rwc io.ReadWriteCloser, h Handler) error {
	sess, err := yamux.Server(rwc, yamuxConfig())
	if err != nil {
		rwc.Close()
		return err
	}
	defer sess.Close()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return err
		}
		go serveStream(sess, st, h)
	}
}

func serveStream(sess *yamux.Session, st *yamux.Stream, h Handler) {
	s := &Stream{st: st, method: "call"}
	defer st.Close()
	kind, p, err := s.readFrame()
	if err != nil || kind != frameCall {
		return
	}
	s.method = string(p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The client abandoning the call (its side closed or the session gone)
	// ends ctx and stops sends that would wait for a window nobody opens.
	s.ctx = ctx
	s.cancel = func() {
		cancel()
		s.wmu.Lock()
		s.gone = true
		s.wmu.Unlock()
	}
	go func() {
		select {
		case <-sess.CloseChan():
		case <-ctx.Done():
		}
		st.SetWriteDeadline(time.Now())
	}()
	if err := h(s.method, s); err != nil {
		var re *RemoteError
		if errors.As(err, &re) {
			err = errors.New(re.Msg)
		}
		msg := err.Error()
		s.writeFrame(append(newFrame(frameError, len(msg)), msg...))
	}
}
