package helper

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/netstack"
)

// A held port: a connection made while nobody accepts is held (not
// refused), WaitConn sees it without accepting it, and a listener made
// from the copy a helper inherits accepts that very connection; a wait
// with nothing coming ends with its context; Close frees the port.
func TestHeldPortHoldsAConnection(t *testing.T) {
	h, err := Bind([]netstack.Publish{{HostIP: "127.0.0.1", GuestPort: 80, Proto: "tcp"}, {GuestPort: 53, Proto: "udp"}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addrs := h.Ports()
	if len(addrs) != 1 {
		t.Fatalf("held %v, want the TCP port only", addrs)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err = h.WaitConn(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with no connection: %v, want its context's end", err)
	}

	waited := make(chan error, 1)
	go func() { waited <- h.WaitConn(context.Background()) }()
	c, err := net.DialTimeout("tcp", addrs[0], 10*time.Second)
	if err != nil {
		t.Fatalf("connect to the held port: %v", err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("WaitConn: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WaitConn did not see the waiting connection within 30 s")
	}

	// What a helper inherits accepts the connection that waited.
	files := h.files()
	if len(files) != 1 || files[0] == nil {
		t.Fatalf("files %v", files)
	}
	l, err := net.FileListener(files[0])
	files[0].Close()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.(*net.TCPListener).SetDeadline(time.Now().Add(30 * time.Second))
	in, err := l.Accept()
	if err != nil {
		t.Fatalf("accept the held connection: %v", err)
	}
	defer in.Close()
	in.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, 5)
	if _, err := io.ReadFull(in, got); err != nil || string(got) != "hello" {
		t.Fatalf("held connection's bytes: %q %v", got, err)
	}

	l.Close()
	h.Close()
	if c2, err := net.DialTimeout("tcp", addrs[0], 10*time.Second); err == nil {
		c2.Close()
		t.Errorf("port %s still accepts connections after Close", addrs[0])
	}
}
