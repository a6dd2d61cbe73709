//go:build linux

package guestinit

import (
	"bytes"
	"errors"
	"os"
	"runtime"
	"testing"
	"time"
)

// sessionReadInFile reports whether some goroutine is inside a
// PortSession's Read and, below it, the file's read.
func sessionReadInFile() bool {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("guestinit.(*PortSession).Read(")) && bytes.Contains(g, []byte("os.(*File).Read(")) {
			return true
		}
	}
	return false
}

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
	// Close is to interrupt a read in progress: wait (with a deadline)
	// until the session's read is blocked in the file's read.
	for deadline := time.Now().Add(10 * time.Second); !sessionReadInFile(); {
		if time.Now().After(deadline) {
			t.Fatal("the session's read never blocked in the file")
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while a read was in progress")
	}
	// Close returns once no read is in progress: the session's read has
	// left the file's read (its goroutine may not have sent yet).
	if sessionReadInFile() {
		t.Fatal("Close returned before the session's read ended")
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the session's read ended with %v, want the deadline Close set (os.ErrDeadlineExceeded)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session's read did not return after Close")
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
