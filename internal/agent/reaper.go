//go:build linux

package agent

import (
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Reaper collects the exit status of child processes. As PID 1 the agent
// inherits every orphan in the box, so it must wait for all of them
// (wait4(-1)); exit statuses of the processes it started itself are handed
// to whoever waits for that pid. Outside PID 1 (tests on the host) it waits
// for each started pid on its own, so it never steals other children.
type Reaper struct {
	all bool

	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
	early   map[int]earlyStatus
}

// earlyStatus is an exit status reaped before anyone watched the pid.
type earlyStatus struct {
	ws unix.WaitStatus
	at time.Time
}

// earlyTTL bounds how long an unclaimed status is kept. A process the
// agent starts is watched microseconds after it starts; anything older is
// an orphan's, and keeping it would hand a stale status to a later process
// that reuses the pid (the guest's pid_max is 4096).
const earlyTTL = time.Second

// NewReaper returns a reaper; reapAll selects the PID-1 mode.
func NewReaper(reapAll bool) *Reaper {
	r := &Reaper{all: reapAll, waiters: map[int]chan unix.WaitStatus{}, early: map[int]earlyStatus{}}
	if reapAll {
		ch := make(chan os.Signal, 16)
		signal.Notify(ch, unix.SIGCHLD)
		go func() {
			for range ch {
				r.reapAll()
			}
		}()
	}
	return r
}

func (r *Reaper) reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		r.deliver(pid, ws)
	}
}

func (r *Reaper) deliver(pid int, ws unix.WaitStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.waiters[pid]; ok {
		delete(r.waiters, pid)
		ch <- ws
		return
	}
	// An orphan, or a child whose waiter has not registered yet: keep it
	// briefly for Watch, and drop what has expired.
	now := time.Now()
	for p, e := range r.early {
		if now.Sub(e.at) > earlyTTL {
			delete(r.early, p)
		}
	}
	r.early[pid] = earlyStatus{ws, now}
}

// Watch returns a channel that receives pid's exit status once. It must be
// called for every process the agent starts, right after starting it.
func (r *Reaper) Watch(pid int) <-chan unix.WaitStatus {
	ch := make(chan unix.WaitStatus, 1)
	r.mu.Lock()
	if e, ok := r.early[pid]; ok {
		delete(r.early, pid)
		if time.Since(e.at) <= earlyTTL {
			r.mu.Unlock()
			ch <- e.ws
			return ch
		}
	}
	r.waiters[pid] = ch
	r.mu.Unlock()
	if !r.all {
		go func() {
			var ws unix.WaitStatus
			for {
				_, err := unix.Wait4(pid, &ws, 0, nil)
				if err == unix.EINTR {
					continue
				}
				break
			}
			r.deliver(pid, ws)
		}()
	}
	return ch
}
