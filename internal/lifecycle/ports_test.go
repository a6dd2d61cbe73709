package lifecycle

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/netstack"
)

// loopback is one published TCP port on a free loopback port.
var loopback = []netstack.Publish{{HostIP: "127.0.0.1", HostPort: 0, GuestPort: 80, Proto: "tcp"}}

// eventually waits (bounded, polling) until ok holds.
func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !ok(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 30 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// bindable reports whether addr can be listened on (nothing holds it).
func bindable(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func TestPortsHoldKeepsThePortsUntilRelease(t *testing.T) {
	var p Ports
	h, err := p.Hold("box1", "", loopback)
	if err != nil || h == nil {
		t.Fatalf("Hold: %v, %v", h, err)
	}
	addrs := h.Ports()
	if len(addrs) != 1 || bindable(addrs[0]) {
		t.Fatalf("held ports %v: want one, bound", addrs)
	}
	// A second start of the box gets the same sockets, not new ports.
	if h2, err := p.Hold("box1", "", loopback); err != nil || h2 != h {
		t.Fatalf("second Hold = %p, %v; want the held %p", h2, err, h)
	}
	p.Release("box1")
	if !bindable(addrs[0]) {
		t.Errorf("port %s still bound after Release", addrs[0])
	}
	p.Release("box1") // nothing held: a no-op
	if h, err := p.Hold("box2", "", []netstack.Publish{{HostPort: 0, GuestPort: 53, Proto: "udp"}}); h != nil || err != nil {
		t.Errorf("Hold of UDP only = %v, %v; want nothing held", h, err)
	}
}

func TestPortsWatchWakesOnAConnection(t *testing.T) {
	var p Ports
	h, err := p.Hold("box1", "", loopback)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release("box1")
	var woken atomic.Int32
	if err := p.Watch("box1", "", nil, func() { woken.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := p.Watch("box1", "", nil, func() { t.Error("a second watch woke the box") }); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", h.Ports()[0])
	if err != nil {
		t.Fatalf("connect to a held port of a suspended box: %v", err)
	}
	defer c.Close()
	eventually(t, "wake on a connection", func() bool { return woken.Load() == 1 })
	// The box's start takes the same sockets; the waiting connection is
	// still queued on them for its helper.
	h2, err := p.Hold("box1", "", loopback)
	if err != nil || h2 != h {
		t.Fatalf("Hold after the wake = %p, %v; want %p", h2, err, h)
	}
}

func TestPortsWatchBindsForABoxItDidNotStart(t *testing.T) {
	var p Ports
	// A free port, bound by the watch itself.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr)
	l.Close()
	pub := []netstack.Publish{{HostIP: "127.0.0.1", HostPort: addr.Port, GuestPort: 80}}
	woke := make(chan struct{})
	if err := p.Watch("box1", "", pub, func() { close(woke) }); err != nil {
		t.Fatal(err)
	}
	if bindable(addr.String()) {
		t.Fatalf("port %s not bound by Watch", addr)
	}
	// Hold (a start) ends the watch: no wake comes from a later
	// connection.
	if _, err := p.Hold("box1", "", nil); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	p.Release("box1")
	select {
	case <-woke:
		t.Error("woken after its start ended the watch")
	default:
	}
	// A port in use is Bind's error.
	l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	busy := []netstack.Publish{{HostIP: "127.0.0.1", HostPort: l.Addr().(*net.TCPAddr).Port, GuestPort: 80}}
	if err := p.Watch("box2", "", busy, func() {}); err == nil {
		t.Error("Watch bound a port in use")
	}
}

func TestPortsReleaseStale(t *testing.T) {
	home := t.TempDir()
	dirOf := func(id string) string { return filepath.Join(home, id) }
	var p Ports
	hold := func(id string) string {
		h, err := p.Hold(id, "", loopback)
		if err != nil {
			t.Fatal(err)
		}
		return h.Ports()[0]
	}
	live, gone, starting := hold("live"), hold("gone"), hold("starting")
	// "starting" exists and a start holds its lock: it decides.
	if err := os.Mkdir(dirOf("starting"), 0o700); err != nil {
		t.Fatal(err)
	}
	unlock, err := boxdir.LockBox(context.Background(), dirOf("starting"))
	if err != nil {
		t.Fatal(err)
	}
	p.ReleaseStale(map[string]bool{"live": true}, dirOf)
	if bindable(live) || bindable(starting) {
		t.Error("released the ports of a live box, or of one a start holds")
	}
	if !bindable(gone) {
		t.Error("kept the ports of a removed box")
	}
	unlock()
	p.ReleaseStale(map[string]bool{"live": true}, dirOf)
	if !bindable(starting) {
		t.Error("kept the ports of a stopped box whose lock is free")
	}
	p.ReleaseStale(nil, dirOf) // the runtime's close
	if !bindable(live) {
		t.Error("nil live kept a box's ports")
	}
}

func TestWakesResumesOnce(t *testing.T) {
	var w Wakes
	release := make(chan struct{})
	var runs atomic.Int32
	boom := errors.New("resume failed")
	first := make(chan error, 1)
	go func() {
		first <- w.Do(context.Background(), "b", func() error {
			runs.Add(1)
			<-release
			return boom
		})
	}()
	eventually(t, "the first resume running", func() bool { return runs.Load() == 1 })
	// A second caller waits for the resume in progress (here until its
	// context ends) instead of resuming the box again.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := w.Do(ctx, "b", func() error { t.Error("a second resume ran"); return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a waiter whose context ended got %v", err)
	}
	// Another box resumes on its own.
	if err := w.Do(context.Background(), "other", func() error { return nil }); err != nil {
		t.Error(err)
	}
	close(release)
	if err := <-first; !errors.Is(err, boom) {
		t.Errorf("the resume's caller got %v", err)
	}
	// Once it ended, the next call resumes again.
	if err := w.Do(context.Background(), "b", func() error { runs.Add(1); return nil }); err != nil || runs.Load() != 2 {
		t.Errorf("a later resume: %v, %d runs", err, runs.Load())
	}
}

// TestPortsHandOver: ports one Ports watches for a suspended box are
// handed over to another Ports (another process) that starts the box,
// which then holds them (they are not bound twice), and the first holds
// them no more: its Release leaves them bound; a connection queued on
// them stays for the new holder.
func TestPortsHandOver(t *testing.T) {
	dir := t.TempDir()
	var serve, cli Ports
	h, err := serve.Hold("box1", dir, loopback)
	if err != nil || h == nil {
		t.Fatal(h, err)
	}
	addr := h.Ports()[0]
	if err := serve.Watch("box1", dir, nil, func() { t.Error("the hand-over woke the box in the first runtime") }); err != nil {
		t.Fatal(err)
	}
	got, err := cli.Hold("box1", dir, loopback)
	if err != nil || got == nil || len(got.Ports()) != 1 || got.Ports()[0] != addr {
		t.Fatalf("hand-over: %v %v, want %s", got, err, addr)
	}
	serve.Release("box1")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("port released by the first holder after the hand-over: %v", err)
	}
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := got.WaitConn(ctx); err != nil {
		t.Fatalf("the connection did not reach the new holder: %v", err)
	}
	cli.Release("box1")
	if _, err := os.Stat(filepath.Join(dir, HandOverSock)); !os.IsNotExist(err) {
		t.Errorf("hand-over socket left behind: %v", err)
	}
}
