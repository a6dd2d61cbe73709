//go:build linux

package agent_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent"
	"github.com/airlock-run/airlock/internal/agent/client"
)

type fixedKey []byte

func (k fixedKey) Current() ([]byte, <-chan struct{}) { return k, nil }

// serveListener runs agent.ServeListener with lim on a unix socket (as
// the guest agent does on its vsock port) and returns the socket's path.
func serveListener(t *testing.T, secret []byte, lim agent.ListenLimits) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- agent.ServeListener(l, fixedKey(secret), agent.NewServer(agent.Config{Root: "/"}).Handle, lim)
	}()
	t.Cleanup(func() {
		l.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("ServeListener returned %v, want net.ErrClosed", err)
		}
	})
	return sock
}

// closedWithin reports whether the agent closed c (EOF, or a reset when
// it closed with unread bytes) within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

func dialAgent(ctx context.Context, sock string, secret []byte) (*client.Client, error) {
	return client.DialAuth(ctx, secret, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}

// A local user of the host who opens many connections to the agent and
// never completes the handshake (any user can reach a box's vsock port)
// holds at most the pending bound of goroutines in the guest, for at most
// the handshake timeout each, and does not keep the box's host out.
func TestHostileLocalUserHandshakeFlood(t *testing.T) {
	secret := []byte("the box secret")
	const pending, timeout = 4, 700 * time.Millisecond
	sock := serveListener(t, secret, agent.ListenLimits{Pending: pending, HandshakeTimeout: timeout})
	base := runtime.NumGoroutine()
	const flood = 300
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < flood; i++ {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		// Half of them start a handshake they never finish.
		if i%2 == 0 {
			c.Write([]byte("AIRLOCK-SYNC 0123456789abcdef\n"))
		}
		conns = append(conns, c)
	}
	time.Sleep(100 * time.Millisecond) // the agent accepts the last ones
	if n := runtime.NumGoroutine() - base; n > pending+4 {
		t.Fatalf("%d connections that never handshake hold %d goroutines of the agent, want at most %d", flood, n, pending+4)
	}
	// All but `pending` were closed at once: those that sent a SYNC
	// without the host's ticket first, the oldest first.
	closedNow := 0
	var open []net.Conn
	for _, c := range conns {
		if closedWithin(c, 50*time.Millisecond) {
			closedNow++
		} else {
			open = append(open, c)
		}
	}
	if closedNow != flood-pending {
		t.Fatalf("%d of the %d pending connections were closed, want %d", closedNow, flood, flood-pending)
	}
	// The host still connects (its connection pushes out the oldest
	// pending one) and is served.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dialAgent(ctx, sock, secret)
	if err != nil {
		t.Fatalf("the host could not connect during the flood: %v", err)
	}
	if _, err := c.Hello(ctx); err != nil {
		t.Fatalf("hello: %v", err)
	}
	c.Close()
	// The newest stale ones end once their handshake time is up.
	t0 := time.Now()
	for _, c := range open {
		if !closedWithin(c, timeout+2*time.Second) {
			t.Fatalf("a connection that never completed the handshake was not closed within %s", timeout)
		}
	}
	t.Logf("stale connections closed %s after the flood ended", time.Since(t0).Round(10*time.Millisecond))
	// A host with the wrong secret is refused, flood or not.
	if _, err := dialAgent(ctx, sock, []byte("wrong")); err == nil {
		t.Fatal("a host with the wrong secret was served")
	}
}

// Authenticated sessions are bounded too: beyond the bound a host's
// connection is closed, and a place frees when a session ends.
func TestHostileLocalUserSessionBound(t *testing.T) {
	secret := []byte("s")
	sock := serveListener(t, secret, agent.ListenLimits{Sessions: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var held []*client.Client
	for i := 0; i < 2; i++ {
		c, err := dialAgent(ctx, sock, secret)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Hello(ctx); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if c, err := dialAgent(ctx, sock, secret); err == nil {
		_, err = c.Hello(ctx)
		c.Close()
		if err == nil {
			t.Fatal("a third session was served with a bound of 2")
		}
	}
	held[0].Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		c, err := dialAgent(ctx, sock, secret)
		if err == nil {
			_, err = c.Hello(ctx)
			c.Close()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session after one of two ended: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	held[1].Close()
}

// A local user who keeps flooding the agent with connections while the
// host connects (each flood connection sends a SYNC, as the host's does,
// and never proves the secret) does not push out the host's pending
// handshake: the host's SYNC carries a ticket only the secret's holder
// can make, and a connection that showed one is not closed for room.
func TestHostileLocalUserFloodDuringHostHandshake(t *testing.T) {
	secret := []byte("the box secret")
	const pending = 8
	sock := serveListener(t, secret, agent.ListenLimits{Pending: pending, HandshakeTimeout: 5 * time.Second})
	stop := make(chan struct{})
	var flooded sync.WaitGroup
	var opened atomic.Int64
	for w := 0; w < 2; w++ {
		flooded.Add(1)
		go func() {
			defer flooded.Done()
			// The newest connections stay open (the agent closes older
			// ones for room anyway).
			var ring [4 * pending]net.Conn
			defer func() {
				for _, c := range ring {
					if c != nil {
						c.Close()
					}
				}
			}()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("unix", sock)
				if err != nil {
					time.Sleep(time.Millisecond) // a full accept queue
					continue
				}
				opened.Add(1)
				c.Write([]byte("\nAIRLOCK-SYNC 0123456789abcdef\n"))
				if old := ring[i%len(ring)]; old != nil {
					old.Close()
				}
				ring[i%len(ring)] = c
			}
		}()
	}
	defer func() { close(stop); flooded.Wait() }()
	time.Sleep(100 * time.Millisecond) // the flood is on
	const tries = 5
	for i := 0; i < tries; i++ {
		before := opened.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// A full accept queue makes a unix connect fail at once where a
		// vsock one waits: wait for a place, as vsock does.
		c, err := client.DialAuth(ctx, secret, func(ctx context.Context) (net.Conn, error) {
			for {
				var d net.Dialer
				c, err := d.DialContext(ctx, "unix", sock)
				if !errors.Is(err, syscall.EAGAIN) {
					return c, err
				}
				time.Sleep(time.Millisecond)
			}
		})
		if err == nil {
			_, err = c.Hello(ctx)
			c.Close()
		}
		cancel()
		if err != nil {
			t.Fatalf("try %d: the host could not connect during a flood (%d flood connections opened meanwhile): %v", i, opened.Load()-before, err)
		}
	}
	t.Logf("%d flood connections opened during %d host connections", opened.Load(), tries)
}
