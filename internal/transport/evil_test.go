package transport_test

import (
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent/evilagent"
	"github.com/airlock-run/airlock/internal/transport"
)

// unixPair is a connected pair of unix stream sockets (as the fake
// driver's and a virtio-serial port's are).
func unixPair(t *testing.T) (host, guest net.Conn) {
	t.Helper()
	dir := t.TempDir()
	l, err := net.Listen("unix", dir+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		ch <- c
	}()
	h, err := net.Dial("unix", dir+"/s")
	if err != nil {
		t.Fatal(err)
	}
	g := <-ch
	t.Cleanup(func() { h.Close(); g.Close() })
	return h, g
}

// A guest that floods yamux pings (and forges the replies to the host's
// keepalive, reading nothing) is cut off at once: the host's goroutines do
// not grow with the flood (yamux starts one per ping request, each
// waiting up to 30 s to send its reply), and Err says why the session
// ended.
func TestEvilAgentPingFloodIsCutOff(t *testing.T) {
	host, guest := unixPair(t)
	flooded := make(chan int, 1)
	a := &evilagent.Agent{Raw: func(conn net.Conn) error {
		time.Sleep(100 * time.Millisecond) // the host's session is up
		n, err := evilagent.PingFlood(conn, 2*time.Second)
		flooded <- n
		return err
	}}
	go a.Serve(guest, nil)
	before := runtime.NumGoroutine()
	c, err := transport.NewClient(host, time.Now().Add(10*time.Second))
	if err != nil {
		// Cut off before the session was up: the error says why.
		if !errors.Is(err, transport.ErrHostileAgent) || !strings.Contains(err.Error(), "pings") {
			t.Fatalf("NewClient: %v, want ErrHostileAgent naming the pings", err)
		}
		t.Logf("cut off during setup: %v", err)
		return
	}
	defer c.Close()
	peak := 0
	deadline := time.After(5 * time.Second)
	ended := false
	for !ended {
		select {
		case <-c.Done():
			ended = true
		case <-deadline:
			t.Fatalf("session still open during a ping flood; host goroutines: %d (before: %d)", runtime.NumGoroutine(), before)
		case <-time.After(time.Millisecond):
		}
		peak = max(peak, runtime.NumGoroutine())
	}
	n := <-flooded
	t.Logf("guest wrote %d pings; host goroutines: %d before, peak %d", n, before, peak)
	if peak-before > 200 {
		t.Errorf("host goroutines grew from %d to %d during the flood", before, peak)
	}
	err = c.Err()
	if !errors.Is(err, transport.ErrHostileAgent) || !strings.Contains(err.Error(), "pings") {
		t.Fatalf("Err = %v, want ErrHostileAgent naming the pings", err)
	}
}
