//go:build linux

package agent

import (
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
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

// A signal the host sends for an exec whose process has exited and been
// reaped reaches nobody, even when its pid already names another process
// (pid reuse; the guest's pid_max is small), and one sent while it runs
// reaches it.
func TestSignalAfterReapSparesReusedPid(t *testing.T) {
	s := NewServer(Config{Root: "/"})
	env := []string{"PATH=/usr/bin:/bin"}
	p, err := s.spawn(&agentpb.ExecStart{Argv: []string{"sleep", "30"}, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	p.signal(unix.SIGTERM)
	select {
	case ws := <-p.wait:
		if ws.Signal() != unix.SIGTERM {
			t.Fatalf("running exec: status %v, want killed by SIGTERM", ws)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a signal to a running exec did not reach it")
	}
	p.end()

	p, err = s.spawn(&agentpb.ExecStart{Argv: []string{"true"}, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	defer p.end()
	<-p.wait // reaped; the Exec handler has not seen it yet
	// Another process takes the pid number.
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Process.Kill()
	gone := make(chan struct{})
	go func() { other.Wait(); close(gone) }()
	p.pid, p.pgid = other.Process.Pid, other.Process.Pid
	p.signal(unix.SIGKILL)
	select {
	case <-gone:
		t.Fatal("a signal for an exec that had been reaped killed the process that reused its pid")
	case <-time.After(300 * time.Millisecond):
	}
}
