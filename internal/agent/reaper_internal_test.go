//go:build linux

package agent

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestReaperHandsEarlyStatusOnlyWhileFresh(t *testing.T) {
	r := &Reaper{all: true, waiters: map[int]chan unix.WaitStatus{}, early: map[int]earlyStatus{}}
	// Reaped before Watch: a just-started process that exited at once.
	r.deliver(100, unix.WaitStatus(3<<8))
	select {
	case ws := <-r.Watch(100):
		if ws.ExitStatus() != 3 {
			t.Fatalf("status %v", ws)
		}
	default:
		t.Fatal("a fresh early status was not handed to Watch")
	}
	// An orphan's status, long unclaimed, must not be handed to a new
	// process that reuses its pid.
	r.deliver(200, unix.WaitStatus(7<<8))
	r.mu.Lock()
	e := r.early[200]
	e.at = e.at.Add(-2 * earlyTTL)
	r.early[200] = e
	r.mu.Unlock()
	ch := r.Watch(200)
	select {
	case ws := <-ch:
		t.Fatalf("stale status %v handed to a reused pid", ws)
	case <-time.After(50 * time.Millisecond):
	}
	r.deliver(200, unix.WaitStatus(0))
	if ws := <-ch; ws.ExitStatus() != 0 {
		t.Fatalf("status of the new process: %v", ws)
	}
	// Expired entries are pruned.
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.early) != 0 {
		t.Fatalf("early statuses kept: %v", r.early)
	}
}
