//go:build linux

package guestinit

import (
	"errors"
	"os"
	"testing"
	"time"
)

// Closing a PortSession ends a read in progress and every later use of the
// session, and leaves the file itself open for the next session: what
// arrives afterwards is read from the same descriptor, none of it taken
// by the ended session.
func TestPortSessionCloseKeepsFile(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	s := NewPortSession(r)
	done := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 16))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // the read is blocked
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return while a read was in progress")
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the session's read returned data nobody wrote")
		}
	default:
		t.Fatal("Close returned before the session's read ended")
	}
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after Close: %v, want os.ErrClosed", err)
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("write after Close: %v, want os.ErrClosed", err)
	}
	if s.Reopen() {
		t.Fatal("Reopen with the other end still open")
	}
	if _, err := w.Write([]byte("next")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16)
	n, err := r.Read(b)
	if err != nil || string(b[:n]) != "next" {
		t.Fatalf("the file after Close read %q, %v; want \"next\"", b[:n], err)
	}
	w.Close()
	if HostConnected(r) {
		t.Fatal("HostConnected with the other end closed")
	}
	if !s.Reopen() {
		t.Fatal("no Reopen with the other end closed")
	}
}
