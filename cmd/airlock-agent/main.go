//go:build linux

// Command airlock-agent is the guest agent: a static binary that runs as
// PID 1 (/init of the agent disk the airlock kernel mounts as its root, or of
// the initramfs for kernels that load modules), assembles the box root, and
// serves the agent protocol to the host over a virtio-serial port.
//
// Outside a VM, `airlock-agent -listen unix:PATH [-root DIR]` (or
// AIRLOCK_AGENT_LISTEN=unix:PATH) serves the same protocol on a unix socket
// in host mode; the tests and the fake VM driver use it to exercise exec
// semantics and the box lifecycle without booting a guest.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/guestinit"
	"github.com/airlock-run/airlock/internal/transport"
)

func main() {
	if l := os.Getenv(guestabi.HostListenEnv); l != "" {
		serveHost(l, "/")
		return
	}
	if os.Getpid() == 1 && os.Getenv("AIRLOCK_BARE") == "1" { // guestabi.BareParam
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
	serveHost(*listen, *root)
}

// serveHost serves the agent on a unix socket (listen is unix:PATH) in
// host mode: it mounts nothing, makes no cgroups and touches no /etc, nor
// the host's RNG or clock (Restored), and a Shutdown call ends the agent. As PID 1 (of a PID namespace) it reaps
// every child, and its exit ends every process it started.
func serveHost(listen, root string) {
	path, ok := strings.CutPrefix(listen, "unix:")
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
	hostTestFaults()
	g := agent.NewServer(agent.Config{Root: root, ReapAll: os.Getpid() == 1, OnHost: true, Shutdown: func() { os.Exit(0) }}).Handle
	fmt.Fprintf(os.Stderr, "%sready on %s (host mode)\n", guestabi.LogPrefix, path)
	err = agent.ServeListener(l, noKey{}, g, agent.ListenLimits{})
	fmt.Fprintln(os.Stderr, "airlock-agent:", err)
	os.Exit(1)
}

// noKey is the box secret of an agent whose host sent none: any host is
// served.
type noKey struct{}

func (noKey) Current() ([]byte, <-chan struct{}) { return nil, nil }

// bareInit is the trivial init of the boot benchmark (AIRLOCK_BARE=1 on the
// kernel command line): it mounts the image's root filesystem read-only,
// runs its /bin/true, prints a marker on the console and idles. Launch to
// marker on the same QEMU command line, kernel and disks is the lower limit
// of a box's cold start.
func bareInit() {
	os.MkdirAll("/dev", 0o755)
	syscall.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	if err := guestinit.LoadModules(); err != nil { // Debian kernels: virtio_blk, erofs
		fmt.Fprintln(os.Stderr, "bare init:", err)
	}
	os.MkdirAll("/proc", 0o755)
	syscall.Mount("proc", "/proc", "proc", 0, "")
	cmdline, _ := os.ReadFile("/proc/cmdline")
	p := guestinit.ParseCmdline(string(cmdline))
	os.MkdirAll("/mnt/base", 0o755)
	for i := 0; i < 2000; i++ {
		if _, err := os.Stat(p.Root); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := syscall.Mount(p.Root, "/mnt/base", p.RootFSType, syscall.MS_RDONLY, ""); err != nil {
		fmt.Fprintln(os.Stderr, "bare init: mount", p.Root+":", err)
	}
	pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{
		Env: []string{"PATH=/usr/bin:/bin"},
		Sys: &syscall.SysProcAttr{Chroot: "/mnt/base"},
	})
	if err == nil {
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	} else {
		fmt.Fprintln(os.Stderr, "bare init: run true:", err)
	}
	fmt.Fprintln(os.Stderr, guestabi.BareMarker)
	for {
		time.Sleep(time.Hour)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "%s%v\n", guestabi.FatalPrefix, err)
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
	stamp := func(what string) {
		if p.Debug {
			guestinit.Logf("%s at uptime %s", what, guestinit.Uptime())
		}
	}
	stamp("started")
	if err := guestinit.MountRoot(p); err != nil {
		fatal(err)
		return
	}
	stamp("root mounted")
	if err := guestinit.MountVolumes(); err != nil {
		fatal(err)
		return
	}
	guestinit.Hostname(p.Hostname)
	if err := guestinit.Network(p.Net, p.KernelIP); err != nil {
		guestinit.Logf("network: %v", err)
	}
	stamp("network up")
	guestTestFaults()
	srv := agent.NewServer(agent.Config{
		Root:        guestinit.NewRoot,
		CgroupRoot:  filepath.Join(guestinit.NewRoot, "sys/fs/cgroup"),
		ReapAll:     true,
		Shutdown:    guestinit.PowerOff,
		SetHostname: guestinit.Hostname,
	})
	// The prewarm runs while the agent finds its ports and reads the box
	// secret, and ends before the first handshake: the host connects at
	// once, and the prewarm's process (nice 0, the agent -15) used to be
	// starved until the host's first exec had translated ld.so, libc
	// and the exec path itself (~100 ms under TCG).
	prewarmed := make(chan struct{})
	go func() {
		defer close(prewarmed)
		srv.Prewarm()
	}()
	g := srv.Handle
	devs, err := guestinit.FindPorts(p.Port, p.Ports, 10*time.Second)
	if err != nil {
		fatal(err)
		return
	}
	// The box secret authenticates every host connection (see
	// transport.GuestHandshakeAuth). Without a secret port the host sent
	// none, and any host on the ports is served.
	var secret transport.GuestKey = noKey{}
	if s, err := guestinit.WatchSecret(time.Second); err != nil {
		guestinit.Logf("no box secret (%v): host connections are not authenticated", err)
	} else {
		secret = s
	}
	stamp("secret read")
	select {
	case <-prewarmed:
	case <-time.After(prewarmWait):
		// A /bin/true that hangs must not keep the host out.
	}
	stamp("prewarmed")
	if p.VsockPort != 0 {
		go serveVsock(p.VsockPort, secret, g)
	}
	hub := guestinit.NewSIGIOHub(len(devs))
	guestinit.Logf("ready (uptime %s)", guestinit.Uptime())
	for i, dev := range devs[1:] {
		go servePort(dev, hub.Sub(i+1), secret, g)
	}
	servePort(devs[0], hub.Sub(0), secret, g)
}

// prewarmWait bounds how long the agent waits for its prewarm before it
// answers the host.
const prewarmWait = 2 * time.Second

// serveVsock serves the agent on an AF_VSOCK port, for hosts with
// vhost-vsock: every connection is independent, so any number of host
// processes can connect. The same handshake runs first, for one code path.
// Any local user of the host can connect too (the box's CID shows in ps):
// ServeListener bounds the connections that wait in the handshake, and
// how long they may.
func serveVsock(port uint32, secret transport.GuestKey, g transport.Handler) {
	l, err := vsock.Listen(port, nil)
	if err != nil {
		guestinit.Logf("vsock port %d: %v (serving on virtio-serial only)", port, err)
		return
	}
	err = agent.ServeListener(l, secret, g, agent.ListenLimits{})
	guestinit.Logf("vsock port %d: %v (serving on virtio-serial only)", port, err)
}

// servePort serves one virtio-serial port forever: wait for a host, run the
// handshake, serve a session, and start over when the session ends: on
// the same descriptor when a host is connected (a new host's SYNC ended
// the session, as after a restore from a snapshot), else on a new open
// once a host connects.
func servePort(dev string, sigio <-chan os.Signal, secret transport.GuestKey, g transport.Handler) {
	var f *os.File
	for {
		if f == nil {
			var err error
			f, err = guestinit.OpenPort(dev, sigio)
			if err != nil {
				guestinit.Logf("open %s: %v", dev, err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
		}
		if err := transport.GuestHandshakeKey(f, agent.Version, secret); err != nil {
			f.Close()
			f = nil
			if errors.Is(err, transport.ErrDenied) {
				// Give the refused host time to read DENY and hang up.
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		s := guestinit.NewPortSession(f)
		transport.Serve(s, g)
		s.Close()
		if s.Reopen() {
			f.Close()
			f = nil
		}
	}
}
