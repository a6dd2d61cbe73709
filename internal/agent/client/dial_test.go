package client

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// A dial whose context is cancelled during the handshake (an interrupted
// fork or start) says so, not that the agent's handshake timed out.
func TestDialCancelledDuringHandshake(t *testing.T) {
	host, guest := net.Pipe()
	defer guest.Close()
	go func() { // a peer that reads and never answers
		b := make([]byte, 512)
		for {
			if _, err := guest.Read(b); err != nil {
				return
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	t0 := time.Now()
	_, err := Dial(ctx, func(context.Context) (net.Conn, error) { return host, nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial cancelled during the handshake: %v, want context.Canceled", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("Dial returned %s after the cancel", d)
	}
}
