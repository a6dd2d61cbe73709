//go:build linux

// Command evilguest is what root in a box can do to the host's agent
// connection, for the real-VM hostile-agent test (TestHostileGuestTakesOverAgent
// in package airlock): it stops airlock-agent (PID 1: it cannot be killed
// without panicking the kernel, so it is stopped with ptrace, every
// thread), takes its virtio-serial ports (pidfd_getfd: a port opens only
// once), and serves the agent protocol on them itself with
// internal/agent/evilagent, answering CopyOut with an archive that holds
// .bashrc and .ssh/authorized_keys beside the tree asked for, and every
// ReadDir with names of 4 MiB. The agent stays stopped while this program
// runs.
//
// Usage (as root in the box, detached): evilguest [-delay 1s] [-flood 10s]
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/agent/evilagent"
)

func main() {
	delay := flag.Duration("delay", time.Second, "wait before taking over (the exec that started this returns)")
	flood := flag.Duration("flood", 0, "instead of answering calls, flood each host connection with yamux pings for this long")
	flag.Parse()
	time.Sleep(*delay)
	if err := run(*flood); err != nil {
		fmt.Fprintln(os.Stderr, "evilguest:", err)
		os.Exit(1)
	}
}

func run(flood time.Duration) error {
	runtime.LockOSThread() // ptrace: the tracer is this thread
	stopped, err := stopAgent()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "evilguest: stopped %d threads of PID 1\n", stopped)
	ports, err := takePorts()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "evilguest: took %d ports\n", len(ports))
	a := &evilagent.Agent{Calls: map[string]evilagent.Script{
		"CopyOut": copyOut,
		"ReadDir": readDir,
	}}
	if flood > 0 {
		a.Raw = func(conn net.Conn) error {
			n, err := evilagent.PingFlood(conn, flood)
			fmt.Fprintf(os.Stderr, "evilguest: %d pings written: %v\n", n, err)
			return err
		}
	}
	for _, p := range ports {
		go serve(a, p)
	}
	select {} // the agent stays stopped while this process lives
}

// stopAgent seizes and interrupts every thread of PID 1, until no new
// thread appears.
func stopAgent() (int, error) {
	seized := map[int]bool{}
	for round := 0; round < 10; round++ {
		ents, err := os.ReadDir("/proc/1/task")
		if err != nil {
			return 0, err
		}
		added := false
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || seized[tid] {
				continue
			}
			if err := unix.PtraceSeize(tid); err != nil {
				return 0, fmt.Errorf("ptrace seize %d: %w", tid, err)
			}
			if err := unix.PtraceInterrupt(tid); err != nil {
				return 0, fmt.Errorf("ptrace interrupt %d: %w", tid, err)
			}
			var ws unix.WaitStatus
			if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
				return 0, fmt.Errorf("wait %d: %w", tid, err)
			}
			seized[tid], added = true, true
		}
		if !added {
			return len(seized), nil
		}
	}
	return len(seized), nil
}

// takePorts duplicates PID 1's open virtio-serial ports into this process.
func takePorts() ([]*os.File, error) {
	pidfd, err := unix.PidfdOpen(1, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open 1: %w", err)
	}
	ents, err := os.ReadDir("/proc/1/fd")
	if err != nil {
		return nil, err
	}
	var out []*os.File
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/1/fd", e.Name()))
		if err != nil || !strings.Contains(target, "vport") {
			continue
		}
		n, _ := strconv.Atoi(e.Name())
		fd, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			return nil, fmt.Errorf("pidfd_getfd %s: %w", target, err)
		}
		// The port is non-blocking (the agent's Go runtime opened it):
		// os.NewFile puts it in the poller, and deadlines work.
		out = append(out, os.NewFile(uintptr(fd), target))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("PID 1 holds no virtio-serial port")
	}
	return out, nil
}

// serve answers hosts on port p forever: while no host is connected a
// read ends at once, so a failed handshake is retried after a pause.
func serve(a *evilagent.Agent, p *os.File) {
	for {
		err := a.ServePort(p)
		fmt.Fprintf(os.Stderr, "evilguest: %s: session ended: %v\n", p.Name(), err)
		time.Sleep(100 * time.Millisecond)
	}
}

func copyOut(c *evilagent.Call) error {
	req, err := c.FileRequest()
	if err != nil {
		return err
	}
	top := filepath.Base(filepath.Clean("/" + req.Path))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []tar.Header{
		{Name: top, Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: top + "/x", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		{Name: ".ssh", Typeflag: tar.TypeDir, Mode: 0o777},
		{Name: ".ssh/authorized_keys", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		{Name: ".bashrc", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
	} {
		h.Format = tar.FormatPAX
		tw.WriteHeader(&h)
		if h.Size > 0 {
			tw.Write([]byte("evil"))
		}
	}
	tw.Close()
	c.Result(&agentpb.FileResult{More: true, Infos: []*agentpb.FileInfo{{Name: top, Mode: uint32(fs.ModeDir | 0o755)}}})
	c.Data(buf.Bytes())
	return c.Result(&agentpb.FileResult{})
}

func readDir(c *evilagent.Call) error {
	if _, err := c.FileRequest(); err != nil {
		return err
	}
	name := strings.Repeat("n", 4<<20-64)
	for i := 0; i < 64; i++ {
		if err := c.Result(&agentpb.FileResult{More: true, Infos: []*agentpb.FileInfo{{Name: name + strconv.Itoa(i), Mode: 0o644}}}); err != nil {
			return err
		}
	}
	return c.Result(&agentpb.FileResult{})
}
