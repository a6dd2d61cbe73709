//go:build linux

package guestinit

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// FindPorts returns the /dev nodes of the virtio-serial ports whose names
// start with prefix, waiting up to d for want of them to appear (want 0: at
// least one, and a moment more for its siblings).
func FindPorts(prefix string, want int, d time.Duration) ([]string, error) {
	deadline := time.Now().Add(d)
	var settle time.Time
	for {
		var devs []string
		ents, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, e := range ents {
			b, err := os.ReadFile(e)
			if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), prefix) {
				dev := "/dev/" + filepath.Base(filepath.Dir(e))
				if _, err := os.Stat(dev); err == nil {
					devs = append(devs, dev)
				}
			}
		}
		if want > 0 && len(devs) >= want {
			return devs, nil
		}
		if len(devs) > 0 && want == 0 {
			if settle.IsZero() {
				settle = time.Now().Add(50 * time.Millisecond)
			} else if time.Now().After(settle) {
				return devs, nil
			}
		}
		if time.Now().After(deadline) {
			if len(devs) > 0 {
				return devs, nil
			}
			return nil, fmt.Errorf("no virtio-serial port named %s*", prefix)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// portPoll is how often OpenPort looks for a host without a SIGIO.
const portPoll = 5 * time.Second

// OpenPort opens the port and waits until a host process is connected to
// its other end. While no host is connected a read returns EOF at once, so
// the wait uses SIGIO (the port signals a host connecting; sigio buffers
// one, so none is lost between the check and the wait) with a slow
// fallback poll rather than spinning. Slow: the ports no host uses wait
// here for the box's whole life, and each wakeup of theirs that falls
// into a restore's first moments is code QEMU's TCG translates anew
// (docs/snapshots.md).
func OpenPort(dev string, sigio <-chan os.Signal) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	setAsync := func(on bool) {
		rc.Control(func(fd uintptr) {
			unix.FcntlInt(fd, unix.F_SETOWN, os.Getpid())
			fl, _ := unix.FcntlInt(fd, unix.F_GETFL, 0)
			if on {
				fl |= unix.O_ASYNC
			} else {
				fl &^= unix.O_ASYNC
			}
			unix.FcntlInt(fd, unix.F_SETFL, fl)
		})
	}
	setAsync(true)
	for !HostConnected(f) {
		select {
		case <-sigio:
		case <-time.After(portPoll):
		}
	}
	setAsync(false)
	return f, nil
}

// HostConnected reports whether a host process is connected to the other
// end of the open port f (no POLLHUP).
func HostConnected(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, 0); err == nil {
			ok = pfd[0].Revents&unix.POLLHUP == 0
		}
	})
	return ok
}

// PortSession is the port f as one session's connection: its Close ends
// the session's use of f, interrupting a read or write in progress (a
// deadline), but leaves f open, so that the port serves the next host
// without being closed and opened again. A restored box's old session is
// ended by its new host's first bytes, and the handshake runs on at once
// instead of after a reopen and a wait for SIGIO (code that QEMU's TCG
// would translate anew for every restore; see docs/snapshots.md). Where f
// takes no deadline, Close closes it (Reopen then reports true).
type PortSession struct {
	f        *os.File
	mu       sync.Mutex
	closed   bool
	shut     bool // f itself was closed
	inflight sync.WaitGroup
}

// NewPortSession wraps f; see PortSession.
func NewPortSession(f *os.File) *PortSession { return &PortSession{f: f} }

func (c *PortSession) begin() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.inflight.Add(1)
	return true
}

// Read reads from the port; after Close it returns os.ErrClosed.
func (c *PortSession) Read(p []byte) (int, error) {
	if !c.begin() {
		return 0, os.ErrClosed
	}
	defer c.inflight.Done()
	return c.f.Read(p)
}

// Write writes to the port; after Close it returns os.ErrClosed.
func (c *PortSession) Write(p []byte) (int, error) {
	if !c.begin() {
		return 0, os.ErrClosed
	}
	defer c.inflight.Done()
	return c.f.Write(p)
}

// Close ends the session's use of the port and returns once no read or
// write of it is in progress.
func (c *PortSession) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	if err := c.f.SetDeadline(time.Now()); err != nil {
		c.shut = true
		return c.f.Close()
	}
	c.inflight.Wait()
	return c.f.SetDeadline(time.Time{})
}

// Reopen reports whether the port must be opened again for the next host:
// f was closed, or no host is connected (a read would return EOF at once
// until one is; OpenPort waits for it). Call it after Close.
func (c *PortSession) Reopen() bool {
	return c.shut || !HostConnected(c.f)
}

// SIGIOHub fans SIGIO out to every port loop (a signal does not say which
// port it is for).
type SIGIOHub struct {
	subs []chan os.Signal
}

// NewSIGIOHub starts delivering SIGIO to n subscribers.
func NewSIGIOHub(n int) *SIGIOHub {
	h := &SIGIOHub{}
	for i := 0; i < n; i++ {
		h.subs = append(h.subs, make(chan os.Signal, 1))
	}
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, unix.SIGIO)
	go func() {
		for s := range ch {
			for _, c := range h.subs {
				select {
				case c <- s:
				default:
				}
			}
		}
	}()
	return h
}

// Sub returns subscriber i's channel.
func (h *SIGIOHub) Sub(i int) <-chan os.Signal { return h.subs[i] }
