// Package transport carries the agent protocol between host and guest: a
// line-based handshake that resynchronises the byte stream after every
// (re)connection, then yamux multiplexing, over a virtio-serial port or a
// vsock connection.
//
// A virtio-serial port is one byte pipe that outlives host connections: a
// host process that goes away can leave half-written frames behind, and the
// guest may still hold a session from the previous host. The handshake is
// what makes reconnecting safe:
//
//	host  -> guest: "AIRLOCK-SYNC <nonce>\n"   (repeated until acknowledged)
//	guest -> host : "AIRLOCK-ACK <nonce> <agent version>\n"
//	host  -> guest: "AIRLOCK-GO <nonce>\n"
//
// Each side discards every byte that is not the line it waits for, so stale
// data from an earlier connection is dropped. After GO both sides start
// yamux (host = client, guest = server), and each call is one yamux stream
// of length-prefixed frames carrying protobuf messages (Client.Call, Serve).
// See docs/agent-protocol.md.
package transport

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"
)

const (
	syncPrefix = "AIRLOCK-SYNC "
	ackPrefix  = "AIRLOCK-ACK "
	goPrefix   = "AIRLOCK-GO "
	// maxLine bounds how much garbage one handshake line may hold before it
	// is discarded.
	maxLine = 256
)

// ErrHandshakeTimeout is returned when the peer does not complete the
// handshake in time; on the host it usually means the guest agent is not
// running yet, or another process holds the box's agent socket.
var ErrHandshakeTimeout = errors.New("agent handshake timed out")

// ErrAgentUnresponsive is the cause of a session the host ended because the
// agent stopped answering keepalive pings (Client.Err).
var ErrAgentUnresponsive = errors.New("the guest agent stopped answering")

// newNonce returns a fresh 16-hex-digit nonce. It only has to differ from
// the nonces of earlier connections (stale lines are told apart by it), so
// math/rand's per-process random seed is enough: crypto/rand would bring
// the whole crypto stack's package initialization into the guest agent's
// start (~5 ms under TCG).
func newNonce() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// readLine reads one '\n'-terminated line, dropping lines longer than
// maxLine. It returns the line without the newline.
func readLine(r *bufio.Reader) (string, error) {
	var buf bytes.Buffer
	for {
		c, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		if c == '\n' {
			return buf.String(), nil
		}
		if buf.Len() >= maxLine {
			buf.Reset()
		}
		buf.WriteByte(c)
	}
}

// lastField returns the text after prefix on a line that may carry garbage
// before the prefix.
func afterPrefix(line, prefix string) (string, bool) {
	i := strings.LastIndex(line, prefix)
	if i < 0 {
		return "", false
	}
	return line[i+len(prefix):], true
}

// HostHandshake runs the host side of the handshake on conn and returns the
// agent's version. It resends SYNC every resend interval until an ACK with
// the same nonce arrives or the deadline passes. conn's read deadline is
// used and cleared again before returning.
func HostHandshake(conn net.Conn, deadline time.Time) (agentVersion string, err error) {
	nonce := newNonce()
	syncLine := []byte("\n" + syncPrefix + nonce + "\n")
	type ack struct {
		version string
		err     error
	}
	acks := make(chan ack, 1)
	// Read with a deadline so the reader goroutine ends when we give up.
	if err := conn.SetReadDeadline(deadline); err != nil {
		return "", err
	}
	go func() {
		// Byte-at-a-time reads: nothing after the ACK line may be consumed,
		// since yamux follows.
		r := bufio.NewReaderSize(byteReader{conn}, 16)
		for {
			line, err := readLine(r)
			if err != nil {
				acks <- ack{err: err}
				return
			}
			rest, ok := afterPrefix(line, ackPrefix)
			if !ok {
				continue
			}
			f := strings.Fields(rest)
			if len(f) >= 1 && f[0] == nonce {
				v := ""
				if len(f) > 1 {
					v = f[1]
				}
				acks <- ack{version: v}
				return
			}
		}
	}()
	// Resend quickly at first: after a reconnect the guest may still be
	// running the previous session, which the first SYNC ends.
	interval := 20 * time.Millisecond
	resend := time.NewTimer(interval)
	defer resend.Stop()
	if _, err := conn.Write(syncLine); err != nil {
		return "", fmt.Errorf("write handshake: %w", err)
	}
	for {
		select {
		case a := <-acks:
			if a.err != nil {
				var ne net.Error
				if errors.As(a.err, &ne) && ne.Timeout() {
					return "", ErrHandshakeTimeout
				}
				if errors.Is(a.err, io.EOF) {
					return "", fmt.Errorf("agent connection closed during handshake: %w", a.err)
				}
				return "", fmt.Errorf("agent handshake: %w", a.err)
			}
			if err := conn.SetReadDeadline(time.Time{}); err != nil {
				return "", err
			}
			if _, err := conn.Write([]byte(goPrefix + nonce + "\n")); err != nil {
				return "", fmt.Errorf("write handshake: %w", err)
			}
			return a.version, nil
		case <-resend.C:
			if _, err := conn.Write(syncLine); err != nil {
				return "", fmt.Errorf("write handshake: %w", err)
			}
			if interval < 250*time.Millisecond {
				interval *= 2
			}
			resend.Reset(interval)
		}
	}
}

// GuestHandshake runs the guest side on rw: it waits for a SYNC line,
// answers ACK with version, and returns once the matching GO line arrived.
// Bytes before SYNC and repeated SYNC lines are discarded. rw must not be
// read by anyone else meanwhile; nothing after the GO line is consumed.
func GuestHandshake(rw io.ReadWriter, version string) error {
	r := bufio.NewReaderSize(byteReader{rw}, 16)
	nonce := ""
	for {
		line, err := readLine(r)
		if err != nil {
			return err
		}
		if rest, ok := afterPrefix(line, syncPrefix); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				continue
			}
			if f[0] == nonce {
				// The host repeats SYNC until it sees our ACK; answer each
				// nonce once, or the extra ACKs would land in its yamux stream.
				continue
			}
			nonce = f[0]
			if _, err := io.WriteString(rw, "\n"+ackPrefix+nonce+" "+version+"\n"); err != nil {
				return err
			}
			continue
		}
		if rest, ok := afterPrefix(line, goPrefix); ok && nonce != "" && strings.TrimSpace(rest) == nonce {
			return nil
		}
	}
}

// byteReader makes bufio read one byte per call so that the buffered reader
// never holds bytes that belong to the protocol after the handshake.
type byteReader struct{ r io.Reader }

func (b byteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return b.r.Read(p)
}
