//go:build linux

// Command airlock-agent is the guest agent: a static binary that runs as
// PID 1 (the /init of the box's initramfs), assembles the box root, and
// serves the agent protocol to the host over a virtio-serial port.
//
// Outside a VM, `airlock-agent -listen unix:PATH [-root DIR]` serves the
// same protocol on a unix socket; the tests use it to exercise exec
// semantics without booting a guest.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/airlock-run/airlock/internal/agent"
	"github.com/airlock-run/airlock/internal/guestinit"
	"github.com/airlock-run/airlock/internal/transport"
)

func main() {
	if os.Getenv("AIRLOCK_TRUE") == "1" {
		// The `true` of the bare-boot benchmark.
		return
	}
	if os.Getpid() == 1 && os.Getenv("AIRLOCK_BARE") == "1" {
		bareInit()
		return
	}
	if os.Getpid() == 1 {
		runInit()
		return
	}
	listen := flag.String("listen", "", "serve on unix:PATH instead of the virtio-serial port (for tests)")
	root := flag.String("root", "/", "root directory processes run in")
	flag.Parse()
	path, ok := strings.CutPrefix(*listen, "unix:")
	if !ok {
		fmt.Fprintln(os.Stderr, "airlock-agent: not PID 1; use -listen unix:PATH to serve on a socket")
		os.Exit(2)
	}
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "airlock-agent:", err)
		os.Exit(1)
	}
	srv := agent.NewServer(agent.Config{Root: *root})
	g := srv.GRPCServer()
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "airlock-agent:", err)
			os.Exit(1)
		}
		go func() {
			if err := transport.GuestHandshake(c, agent.Version); err != nil {
				c.Close()
				return
			}
			transport.Serve(c, g)
		}()
	}
}

// bareInit is the trivial init of the boot benchmark (AIRLOCK_BARE=1 on the
// kernel command line): it runs `true` (this binary with AIRLOCK_TRUE=1),
// prints a marker on the console and idles, so that launch-to-marker is the
// lower limit of a box's cold start on the same QEMU command line.
func bareInit() {
	pid, err := syscall.ForkExec("/init", []string{"true"}, &syscall.ProcAttr{Env: []string{"AIRLOCK_TRUE=1"}})
	if err == nil {
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	}
	fmt.Fprintln(os.Stderr, "AIRLOCK-BARE-MARKER")
	for {
		time.Sleep(time.Hour)
	}
}

func fatal(err error) {
	guestinit.Logf("fatal: %v", err)
	time.Sleep(100 * time.Millisecond)
	guestinit.PowerOff()
}

func runInit() {
	// As PID 1 the agent gets only signals it handles. Handle (and drop)
	// the ones whose Go default is to exit, so that `kill -TERM 1` in the
	// box cannot end the agent (and panic the kernel). A handler, unlike
	// SIG_IGN, is not inherited by the processes the agent starts.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGHUP, unix.SIGINT, unix.SIGTERM, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGALRM)
	go func() {
		for range sigs {
		}
	}()
	p, err := guestinit.Early()
	if err != nil {
		fatal(err)
		return
	}
	if err := guestinit.MountRoot(p); err != nil {
		fatal(err)
		return
	}
	guestinit.Hostname(p.Hostname)
	if err := guestinit.Network(p.Net); err != nil {
		guestinit.Logf("network: %v", err)
	}
	srv := agent.NewServer(agent.Config{
		Root:       guestinit.NewRoot,
		CgroupRoot: filepath.Join(guestinit.NewRoot, "sys/fs/cgroup"),
		ReapAll:    true,
		Shutdown:   guestinit.PowerOff,
	})
	g := srv.GRPCServer()
	devs, err := guestinit.FindPorts(p.Port, 10*time.Second)
	if err != nil {
		fatal(err)
		return
	}
	hub := guestinit.NewSIGIOHub(len(devs))
	guestinit.Logf("ready")
	for i, dev := range devs[1:] {
		go servePort(dev, hub.Sub(i+1), g)
	}
	servePort(devs[0], hub.Sub(0), g)
}

// servePort serves one virtio-serial port forever: wait for a host, run the
// handshake, serve a session, and start over when the host goes away.
func servePort(dev string, sigio <-chan os.Signal, g *grpc.Server) {
	for {
		f, err := guestinit.OpenPort(dev, sigio)
		if err != nil {
			guestinit.Logf("open %s: %v", dev, err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err := transport.GuestHandshake(f, agent.Version); err != nil {
			f.Close()
			continue
		}
		transport.Serve(f, g)
	}
}
