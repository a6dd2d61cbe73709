package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// serialPipe is a pair of connected stream ends standing in for a
// virtio-serial port: one byte stream that does not care who is connected.
func serialPipe(t *testing.T) (host, guest net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ch := make(chan net.Conn)
	go func() {
		c, _ := l.Accept()
		ch <- c
	}()
	h, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	g := <-ch
	t.Cleanup(func() { h.Close(); g.Close() })
	return h, g
}

// echoOverYamux checks that a yamux session works after the handshake.
func echoOverYamux(t *testing.T, host, guest net.Conn) {
	t.Helper()
	go func() {
		s, err := yamux.Server(guest, yamuxConfig())
		if err != nil {
			return
		}
		st, err := s.Accept()
		if err != nil {
			return
		}
		io.Copy(st, st)
	}()
	s, err := yamux.Client(host, yamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Open()
	if err != nil {
		t.Fatal(err)
	}
	st.Write([]byte("ping"))
	buf := make([]byte, 4)
	st.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo over yamux after handshake: %q %v", buf, err)
	}
}

func TestHandshakeDiscardsStaleBytes(t *testing.T) {
	host, guest := serialPipe(t)
	// Leftovers of an earlier connection in both directions.
	go guest.Write([]byte("\x00\x01garbage from an old session\nmore\x02"))
	errc := make(chan error, 1)
	go func() {
		// The guest is slow to start: several SYNCs queue up before it
		// reads; it must still answer exactly once.
		time.Sleep(150 * time.Millisecond)
		errc <- GuestHandshake(guest, "test-1")
	}()
	host.Write([]byte("stale host bytes without newline"))
	v, err := HostHandshake(host, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if v != "test-1" {
		t.Fatalf("agent version %q", v)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	echoOverYamux(t, host, guest)
}

func TestHandshakeTimesOutWithoutAgent(t *testing.T) {
	host, _ := serialPipe(t)
	start := time.Now()
	_, err := HostHandshake(host, time.Now().Add(300*time.Millisecond))
	if err != ErrHandshakeTimeout {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %s", d)
	}
}

func TestNewClientOverHandshake(t *testing.T) {
	host, guest := serialPipe(t)
	go GuestHandshake(guest, "v")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dl, _ := ctx.Deadline()
	c, err := NewClient(host, dl)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.AgentVersion != "v" {
		t.Fatalf("version %q", c.AgentVersion)
	}
}

func TestHandshakeProvesTheSecret(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	t.Run("right secret", func(t *testing.T) {
		host, guest := serialPipe(t)
		errc := make(chan error, 1)
		go func() { errc <- GuestHandshakeAuth(guest, "v", secret) }()
		if _, err := HostHandshakeAuth(host, time.Now().Add(5*time.Second), secret); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		echoOverYamux(t, host, guest)
	})
	for name, hostSecret := range map[string][]byte{"no secret": nil, "wrong secret": []byte("not the secret")} {
		t.Run(name, func(t *testing.T) {
			host, guest := serialPipe(t)
			errc := make(chan error, 1)
			go func() { errc <- GuestHandshakeAuth(guest, "v", secret) }()
			_, err := HostHandshakeAuth(host, time.Now().Add(5*time.Second), hostSecret)
			if !errors.Is(err, ErrDenied) {
				t.Fatalf("host: got %v, want ErrDenied", err)
			}
			if err := <-errc; !errors.Is(err, ErrDenied) {
				t.Fatalf("guest: got %v, want ErrDenied", err)
			}
		})
	}
}

// TestHandshakeTimesOutOnAPortNobodyReads: when the guest never reads, the
// host's SYNC writes block; the deadline must still end the handshake.
func TestHandshakeTimesOutOnAPortNobodyReads(t *testing.T) {
	host, guest := net.Pipe() // unbuffered: every write blocks until read
	defer host.Close()
	defer guest.Close()
	start := time.Now()
	_, err := HostHandshake(host, time.Now().Add(300*time.Millisecond))
	if !errors.Is(err, ErrHandshakeTimeout) {
		t.Fatalf("got %v, want ErrHandshakeTimeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %s", d)
	}
}

// TestSyncTicketed: only a SYNC line whose ticket was made with the
// secret for its nonce counts as the host's; a guest that has no secret
// takes any SYNC; an unfinished line is not a SYNC yet.
func TestSyncTicketed(t *testing.T) {
	secret := []byte("s3cret")
	n := "0123456789abcdef"
	good := "\n" + syncPrefix + n + " " + SyncTicket(secret, n) + "\n"
	for _, c := range []struct {
		pre              string
		secret           []byte
		synced, ticketed bool
	}{
		{good, secret, true, true},
		{"garbage" + good + good, secret, true, true},
		{"\n" + syncPrefix + n + "\n", secret, true, false},
		{"\n" + syncPrefix + n + " " + SyncTicket([]byte("other"), n) + "\n", secret, true, false},
		{"\n" + syncPrefix + "fedcba9876543210 " + SyncTicket(secret, n) + "\n", secret, true, false}, // another nonce's ticket
		{good[:len(good)-1], secret, false, false},
		{"", secret, false, false},
		{"\n" + syncPrefix + n + "\n", nil, true, true},
	} {
		s, tk := SyncTicketed([]byte(c.pre), c.secret)
		if s != c.synced || tk != c.ticketed {
			t.Errorf("SyncTicketed(%q, %q) = %v, %v; want %v, %v", c.pre, c.secret, s, tk, c.synced, c.ticketed)
		}
	}
}
