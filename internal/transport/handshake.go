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
//	host  -> guest: "AIRLOCK-SYNC <nonce> <ticket>\n"   (repeated without the ticket until acknowledged)
//	guest -> host : "AIRLOCK-ACK <nonce> <agent version> <challenge>\n"
//	host  -> guest: "AIRLOCK-GO <nonce> <proof>\n"
//	guest -> host : "AIRLOCK-OK <nonce>\n"      (or "AIRLOCK-DENY <nonce>\n")
//
// Each side discards every byte that is not the line it waits for, so stale
// data from an earlier connection is dropped. The proof authenticates the
// host: HMAC-SHA256 of the challenge and nonce under the box's per-boot
// secret (see Proof), which only the box's owner can read; an agent that
// has a secret answers DENY to a wrong proof and serves nothing on that
// connection. After OK both sides start
// yamux (host = client, guest = server), and each call is one yamux stream
// of length-prefixed frames carrying protobuf messages (Client.Call, Serve).
// See docs/agent-protocol.md.
package transport

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
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
	okPrefix   = "AIRLOCK-OK "
	denyPrefix = "AIRLOCK-DENY "
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

// ErrDenied is returned when the agent refused the host's proof of the
// box secret (the host read a wrong or stale secret file), or, in the
// guest, when a host sent a wrong proof.
var ErrDenied = errors.New("agent refused the connection: wrong box secret (restart the box if its secret file was replaced)")

// Proof returns the host's answer to the agent's challenge: hex
// HMAC-SHA256(secret, "airlock-agent-auth\x00" challenge "\x00" nonce), or
// "-" without a secret.
func Proof(secret []byte, challenge, nonce string) string {
	if len(secret) == 0 {
		return "-"
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("airlock-agent-auth\x00" + challenge + "\x00" + nonce))
	return hex.EncodeToString(m.Sum(nil))
}

// SyncTicket is what the host adds to its SYNC line: hex
// HMAC-SHA256(secret, "airlock-agent-sync\x00" nonce). It lets a guest
// that holds many unauthenticated connections tell, before the
// challenge, which one comes from the secret's holder and keep it (see
// GuestHandshakeVouch); it authenticates nothing by itself: the proof
// answering the guest's challenge still does. An agent that does not
// know it reads the nonce and ignores the rest of the line.
func SyncTicket(secret []byte, nonce string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("airlock-agent-sync\x00" + nonce))
	return hex.EncodeToString(m.Sum(nil))
}

// SyncTicketed reads pre, bytes a connection sent before the guest said
// anything: synced says it holds a whole SYNC line, ticketed that one of
// them carries a valid SyncTicket of secret (any, without a secret).
func SyncTicketed(pre, secret []byte) (synced, ticketed bool) {
	for {
		i := bytes.IndexByte(pre, '\n')
		if i < 0 {
			return synced, ticketed
		}
		line := string(pre[:i])
		pre = pre[i+1:]
		rest, ok := afterPrefix(line, syncPrefix)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		synced = true
		if len(secret) == 0 || len(f) > 1 && hmac.Equal([]byte(f[1]), []byte(SyncTicket(secret, f[0]))) {
			return true, true
		}
	}
}

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

// HostHandshake runs the host side of the handshake on conn without a
// secret (for agents that have none) and returns the agent's version; see
// HostHandshakeAuth.
func HostHandshake(conn net.Conn, deadline time.Time) (agentVersion string, err error) {
	return HostHandshakeAuth(conn, deadline, nil)
}

// HostHandshakeAuth runs the host side of the handshake on conn, proving
// knowledge of secret, and returns the agent's version. It resends SYNC
// every resend interval until an ACK with the same nonce arrives or the
// deadline passes. conn's read deadline is used and cleared again before
// returning. A refused proof is ErrDenied.
func HostHandshakeAuth(conn net.Conn, deadline time.Time, secret []byte) (agentVersion string, err error) {
	nonce := newNonce()
	// Only the first SYNC carries the ticket (the one a guest listener
	// reads when it accepts a vsock connection): the repeats, which a
	// guest reads a byte at a time on a virtio-serial port, stay short.
	syncLine := []byte("\n" + syncPrefix + nonce + "\n")
	firstSync := syncLine
	if len(secret) > 0 {
		firstSync = []byte("\n" + syncPrefix + nonce + " " + SyncTicket(secret, nonce) + "\n")
	}
	type ack struct {
		version, challenge string
		ok                 bool // the OK/DENY line: ok true = OK
		err                error
	}
	acks := make(chan ack, 2)
	// Read with a deadline so the reader goroutine ends when we give up,
	// and write with one: a guest that never reads its port fills the
	// socket with SYNC lines, and a blocked write must not outlast the
	// deadline.
	if err := conn.SetDeadline(deadline); err != nil {
		return "", err
	}
	go func() {
		// Byte-at-a-time reads: nothing after the OK line may be consumed,
		// since yamux follows.
		r := bufio.NewReaderSize(byteReader{conn}, 16)
		acked := false
		for {
			line, err := readLine(r)
			if err != nil {
				acks <- ack{err: err}
				return
			}
			if acked {
				if rest, ok := afterPrefix(line, okPrefix); ok && strings.TrimSpace(rest) == nonce {
					acks <- ack{ok: true}
					return
				}
				if rest, ok := afterPrefix(line, denyPrefix); ok && strings.TrimSpace(rest) == nonce {
					acks <- ack{err: ErrDenied}
					return
				}
				continue
			}
			rest, ok := afterPrefix(line, ackPrefix)
			if !ok {
				continue
			}
			f := strings.Fields(rest)
			if len(f) >= 1 && f[0] == nonce {
				a := ack{}
				if len(f) > 1 {
					a.version = f[1]
				}
				if len(f) > 2 {
					a.challenge = f[2]
				}
				acked = true
				acks <- a
			}
		}
	}()
	fail := func(err error) (string, error) {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return "", ErrHandshakeTimeout
		}
		if errors.Is(err, ErrDenied) {
			return "", err
		}
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("agent connection closed during handshake: %w", err)
		}
		return "", fmt.Errorf("agent handshake: %w", err)
	}
	// Resend quickly at first (every 5 ms for 300 ms, then backing off):
	// after a reconnect the guest may still be running the previous
	// session, which the first SYNC ends, and the next SYNC it reads
	// starts the handshake; a restored guest answers within tens of
	// milliseconds, which a doubling interval would round up.
	interval := 5 * time.Millisecond
	fastUntil := time.Now().Add(300 * time.Millisecond)
	resend := time.NewTimer(interval)
	defer resend.Stop()
	if _, err := conn.Write(firstSync); err != nil {
		return fail(err)
	}
	version := ""
	for {
		select {
		case a := <-acks:
			if a.err != nil {
				return fail(a.err)
			}
			if a.ok {
				if err := conn.SetDeadline(time.Time{}); err != nil {
					return "", err
				}
				return version, nil
			}
			version = a.version
			resend.Stop()
			if _, err := conn.Write([]byte(goPrefix + nonce + " " + Proof(secret, a.challenge, nonce) + "\n")); err != nil {
				return "", fmt.Errorf("write handshake: %w", err)
			}
		case <-resend.C:
			if version != "" {
				continue
			}
			if _, err := conn.Write(syncLine); err != nil {
				return fail(err)
			}
			if interval < 250*time.Millisecond && time.Now().After(fastUntil) {
				interval *= 2
			}
			resend.Reset(interval)
		}
	}
}

// GuestHandshake runs the guest side on rw without a secret: any host
// is served. See GuestHandshakeAuth.
func GuestHandshake(rw io.ReadWriter, version string) error {
	return GuestHandshakeAuth(rw, version, nil)
}

// GuestKey is where the guest side of the handshake takes the box secret
// from: Current returns it (empty: any host is served) and a channel that
// is closed when it is replaced (the host rotates it when it restores a
// box from a snapshot).
type GuestKey interface {
	Current() (secret []byte, changed <-chan struct{})
}

type staticKey []byte

func (k staticKey) Current() ([]byte, <-chan struct{}) { return k, nil }

// RotateGrace is how long the guest waits for a new secret when a proof
// fails against the current one: a host that restored a box from a
// snapshot connects with the new secret while the guest may still be
// reading it from its secret port.
const RotateGrace = 3 * time.Second

// GuestHandshakeAuth is GuestHandshakeKey with a fixed secret.
func GuestHandshakeAuth(rw io.ReadWriter, version string, secret []byte) error {
	return GuestHandshakeKey(rw, version, staticKey(secret))
}

// GuestHandshakeKey runs the guest side on rw: it waits for a SYNC line,
// answers ACK with version and a fresh challenge, and returns once the
// matching GO line arrived with a valid proof of secret (any proof when
// secret is empty; a proof that fails is checked again against a secret
// that replaces the current one within RotateGrace), after answering OK.
// A wrong proof is answered DENY and
// returns ErrDenied: the caller must serve nothing on rw. Bytes before
// SYNC and repeated SYNC lines are discarded. rw must not be read by
// anyone else meanwhile; nothing after the GO line is consumed.
func GuestHandshakeKey(rw io.ReadWriter, version string, key GuestKey) error {
	return GuestHandshakeVouch(rw, version, key, nil)
}

// GuestHandshakeVouch is GuestHandshakeKey that also calls sync, when not
// nil, for each new SYNC line: ticketed says it carried a valid
// SyncTicket of key's current secret (always true without a secret).
// A listener uses it to keep the host's pending handshake when others
// flood it (agent.ServeListener).
func GuestHandshakeVouch(rw io.ReadWriter, version string, key GuestKey, sync func(ticketed bool)) error {
	r := bufio.NewReaderSize(byteReader{rw}, 16)
	nonce, challenge := "", ""
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
			nonce, challenge = f[0], newNonce()+newNonce()
			if sync != nil {
				secret, _ := key.Current()
				sync(len(secret) == 0 || len(f) > 1 && hmac.Equal([]byte(f[1]), []byte(SyncTicket(secret, nonce))))
			}
			if _, err := io.WriteString(rw, "\n"+ackPrefix+nonce+" "+version+" "+challenge+"\n"); err != nil {
				return err
			}
			continue
		}
		if rest, ok := afterPrefix(line, goPrefix); ok && nonce != "" {
			f := strings.Fields(rest)
			if len(f) == 0 || f[0] != nonce {
				continue
			}
			proof := ""
			if len(f) > 1 {
				proof = f[1]
			}
			if !proven(key, proof, challenge, nonce) {
				io.WriteString(rw, "\n"+denyPrefix+nonce+"\n")
				return ErrDenied
			}
			_, err := io.WriteString(rw, "\n"+okPrefix+nonce+"\n")
			return err
		}
	}
}

// proven reports whether proof answers challenge and nonce under key's
// secret (always, for an empty secret), waiting up to RotateGrace for a
// new secret when it does not.
func proven(key GuestKey, proof, challenge, nonce string) bool {
	deadline := time.NewTimer(RotateGrace)
	defer deadline.Stop()
	for {
		secret, changed := key.Current()
		if len(secret) == 0 || hmac.Equal([]byte(proof), []byte(Proof(secret, challenge, nonce))) {
			return true
		}
		if changed == nil {
			return false
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
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
