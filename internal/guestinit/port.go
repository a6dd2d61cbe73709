//go:build linux

package guestinit

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// FindPort returns the /dev node of the virtio-serial port called name,
// waiting up to d for it to appear.
func FindPort(name string, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		ents, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, e := range ents {
			b, err := os.ReadFile(e)
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(e))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio-serial port %q not found", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// OpenPort opens the port and waits until a host process is connected to
// its other end. While no host is connected a read returns EOF at once, so
// the wait uses SIGIO (the port signals a host connecting) with a slow
// fallback poll rather than spinning.
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
	connected := func() bool {
		ok := false
		rc.Control(func(fd uintptr) {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(pfd, 0); err == nil {
				ok = pfd[0].Revents&unix.POLLHUP == 0
			}
		})
		return ok
	}
	setAsync(true)
	for !connected() {
		select {
		case <-sigio:
		case <-time.After(250 * time.Millisecond):
		}
	}
	setAsync(false)
	return f, nil
}

// NotifySIGIO returns the channel OpenPort waits on.
func NotifySIGIO() <-chan os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGIO)
	return ch
}
