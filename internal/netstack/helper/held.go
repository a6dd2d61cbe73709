package helper

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/netstack"
)

// Held is a box's published TCP ports bound by the host process itself
// and kept open there, whether a network helper runs or not: each
// helper inherits them (Options.Held) and accepts on them, and while no
// helper runs (the box is suspended) the kernel queues the connections
// that arrive in the sockets' backlogs: they are held, not refused, and
// WaitConn says that one is waiting, without accepting it, so that the
// box can be resumed and its new helper accept it. UDP ports are not
// held (their helper binds them at each start).
type Held struct {
	ls map[int]*net.TCPListener // by index in the ports bound
}

// Bind binds the TCP ports of pub (by index; HostIP "" is 127.0.0.1,
// HostPort 0 picks a free port, as the helper does). A port in use is an
// error naming it. Nothing is held (nil) when pub has no TCP port.
func Bind(pub []netstack.Publish) (*Held, error) {
	h := &Held{ls: map[int]*net.TCPListener{}}
	for i, p := range pub {
		if p.Proto != "" && p.Proto != "tcp" {
			continue
		}
		ip := p.HostIP
		if ip == "" {
			ip = "127.0.0.1"
		}
		addr := net.JoinHostPort(ip, strconv.Itoa(p.HostPort))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("publish %s: %w", addr, err)
		}
		h.ls[i] = l.(*net.TCPListener)
	}
	if len(h.ls) == 0 {
		return nil, nil
	}
	return h, nil
}

// files returns copies of the held sockets by index, for a helper to
// inherit (nil for a nil h; the copies may be closed once it started).
func (h *Held) files() map[int]*os.File {
	if h == nil {
		return nil
	}
	out := map[int]*os.File{}
	for i, l := range h.ls {
		if f, err := l.File(); err == nil {
			out[i] = f
		}
	}
	return out
}

// Ports returns the addresses held (host "ip:port").
func (h *Held) Ports() []string {
	if h == nil {
		return nil
	}
	var out []string
	for _, l := range h.ls {
		out = append(out, l.Addr().String())
	}
	return out
}

// Close closes the held sockets: their ports are free again and the
// connections queued on them are refused (a nil h holds none).
func (h *Held) Close() {
	if h == nil {
		return
	}
	for _, l := range h.ls {
		l.Close()
	}
}

// WaitConn blocks until a connection is waiting on one of the held
// sockets (it stays queued: it is not accepted), or ctx ends (its error).
// A thread polls the sockets (poll(2), which tells without accepting;
// a listener's RawConn cannot wait for readability) and a pipe that ctx's
// end writes to. The sockets must not be closed before it returns.
func (h *Held) WaitConn(ctx context.Context) error {
	if h == nil || len(h.ls) == 0 {
		<-ctx.Done()
		return ctx.Err()
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	defer pw.Close()
	var fds []unix.PollFd
	for _, l := range h.ls {
		rc, err := l.SyscallConn()
		if err != nil {
			return err
		}
		if err := rc.Control(func(fd uintptr) { fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}) }); err != nil {
			return err
		}
	}
	stop := len(fds)
	fds = append(fds, unix.PollFd{Fd: int32(pr.Fd()), Events: unix.POLLIN})
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			pw.Write([]byte{0})
		case <-done:
		}
	}()
	for {
		_, err := unix.Poll(fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for a connection: %w", err)
		}
		if fds[stop].Revents != 0 {
			return ctx.Err()
		}
		for _, p := range fds[:stop] {
			if p.Revents&unix.POLLIN != 0 {
				return nil
			}
			if p.Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
				return fmt.Errorf("wait for a connection: socket error (revents %#x)", p.Revents)
			}
		}
	}
}

// maxHandOver bounds the sockets Receive takes in one hand-over (a box
// publishes fewer ports).
const maxHandOver = 64

// Send hands the held sockets over to the process at the other end of c
// (SCM_RIGHTS, with their indices as JSON), which takes them with
// Receive; h keeps its own, to be closed by the caller once sent.
func (h *Held) Send(c *net.UnixConn) error {
	files := h.files()
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var idx []int
	var fds []int
	for i, f := range files {
		idx = append(idx, i)
		fds = append(fds, int(f.Fd()))
	}
	msg, err := json.Marshal(idx)
	if err != nil {
		return err
	}
	_, _, err = c.WriteMsgUnix(msg, unix.UnixRights(fds...), nil)
	return err
}

// Receive takes the sockets Send hands over on c (what Send's process
// holds for the box), within c's deadline.
func Receive(c *net.UnixConn) (*Held, error) {
	buf := make([]byte, 4<<10)
	oob := make([]byte, unix.CmsgSpace(maxHandOver*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("receive held ports: %w", err)
	}
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err == nil {
		for i := range msgs {
			more, err := unix.ParseUnixRights(&msgs[i])
			if err == nil {
				fds = append(fds, more...)
			}
		}
	}
	h := &Held{ls: map[int]*net.TCPListener{}}
	var idx []int
	if err := json.Unmarshal(buf[:n], &idx); err != nil || len(idx) != len(fds) || len(fds) == 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("receive held ports: %d sockets for %q", len(fds), buf[:n])
	}
	for k, fd := range fds {
		f := os.NewFile(uintptr(fd), "held-port")
		l, err := net.FileListener(f)
		f.Close()
		tl, ok := l.(*net.TCPListener)
		if err != nil || !ok {
			if l != nil {
				l.Close()
			}
			h.Close()
			for _, rest := range fds[k+1:] {
				unix.Close(rest)
			}
			return nil, fmt.Errorf("receive held ports: not a TCP listener: %v", err)
		}
		h.ls[idx[k]] = tl
	}
	return h, nil
}
