package vmm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// StartTime returns the start time of pid (clock ticks since boot, field 22
// of /proc/PID/stat); together with the pid it identifies a process across
// pid reuse. It returns 0 if the process does not exist or is a zombie.
func StartTime(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0
	}
	// f[0] is field 3 (state); field 22 is f[19].
	if f[0] == "Z" {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// Alive reports whether the process h names still runs.
func (h Handle) Alive() bool {
	return h.PID > 0 && h.Start != 0 && StartTime(h.PID) == h.Start
}

// Watch returns a channel closed when the process h names exits. It uses a
// pidfd, so it works for processes that are not children of the caller;
// where pidfds are missing (old kernel, seccomp) it polls every 200 ms.
func Watch(h Handle) <-chan struct{} {
	ch := make(chan struct{})
	fd, err := unix.PidfdOpen(h.PID, 0)
	if err != nil || !h.Alive() {
		if err == nil {
			unix.Close(fd)
		}
		go func() {
			defer close(ch)
			for h.Alive() {
				time.Sleep(200 * time.Millisecond)
			}
		}()
		return ch
	}
	go func() {
		defer close(ch)
		defer unix.Close(fd)
		for {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(pfd, -1); err == unix.EINTR {
				continue
			}
			return
		}
	}()
	return ch
}

// Kill sends SIGKILL to the process h names if it still runs, and waits up
// to 5 s for it to go.
func Kill(h Handle) error {
	if !h.Alive() {
		return nil
	}
	if err := unix.Kill(h.PID, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for h.Alive() {
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d did not exit after SIGKILL", h.PID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// WaitGone waits until h's process has ended or ctx ends, and reports
// whether it has ended.
func (h Handle) WaitGone(ctx context.Context) bool {
	for h.Alive() {
		if ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
