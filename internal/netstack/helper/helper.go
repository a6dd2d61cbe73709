// Package helper supervises a box's network helper (cmd/airlock-net,
// running package netstack) from the host: it starts the helper before the
// box's machine, confines it (a uid of the box uid range and a cgroup of its
// own, through package confine, when airlock runs as root), waits for it to
// serve the box, records it and its published ports in the box directory,
// stops it, reconciles it after a restart and makes control calls to it.
//
// It is a package of its own, not part of netstack, so that the helper
// process (which links netstack) links none of the host's supervision:
// cgroups, uid allocation, the box directory.
package helper

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gofrs/flock"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/confine"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Limits of a network helper's cgroup (as root): its memory (gVisor's
// stack, the flows' buffers) and its threads. A hostile guest that opens
// many connections hits these instead of growing host memory.
const (
	Memory = 512 << 20
	Pids   = 256
)

// Box is the box a helper serves: its id and directory (where its files
// are, see boxdir).
type Box struct {
	ID  string
	Dir string
}

func (b Box) sock(name string) string { return boxdir.SockPath(b.Dir, b.ID, name) }

// NetSocket is the unix socket the box's machine listens on for its NIC
// (vmm.NetSpec.Socket) and its helper connects to.
func (b Box) NetSocket() string { return b.sock(boxdir.NetSock) }

// Options say how helpers are started.
type Options struct {
	// Bin is the helper binary ("": netstack.FindHelper).
	Bin string
	// Upstream is the DNS server the helper forwards to ("": the host's;
	// see netstack.Config.Upstream).
	Upstream string
	// Unconfined keeps the helper in the caller's uid and cgroup even as
	// root (AIRLOCK_CONFINE=off).
	Unconfined bool
	// UIDRange is the box uid range ("START:COUNT", "": /etc/subuid; see
	// confine.BoxUIDRange).
	UIDRange string
	// Warn gets what the caller should pass on to the user (a helper
	// without a cgroup, one that did not give up root).
	Warn func(string)
	// Secrets, when set, are the box's secrets and CA, which the helper
	// gets through a pipe (netstack.LaunchHelper), never a file.
	Secrets *netstack.SecretConfig
	// Held, when set, holds listening sockets of the published TCP ports
	// (by index in the ports Start publishes) that the helper inherits
	// instead of binding them (see Held).
	Held *Held
}

func (o Options) warn(msg string) {
	if o.Warn != nil {
		o.Warn(msg)
	}
}

// Starting is a helper being started. Its cgroup is made while the
// machine starts, off the start's critical path; Wait does not return
// before the helper is in it.
type Starting struct {
	box    Box
	o      Options
	h      *netstack.Helper
	cgroup chan struct{} // closed once the helper is in its cgroup (or runs without one)
}

// Joined waits until the helper's cgroup is set up (s nil: no helper).
func (s *Starting) Joined() {
	if s != nil {
		<-s.cgroup
	}
}

// Start stops the box's helper if one runs, then launches a new one with
// policy pol and published ports pub, before the box's machine starts:
// the helper binds the published ports and then connects to the machine's
// network socket (Box.NetSocket) once the machine has made it. Wait waits
// for it. Errors name the box ("box ID network: ...").
func Start(b Box, o Options, pol netstack.Policy, pub []netstack.Publish) (s *Starting, err error) {
	Stop(b.Dir)
	os.Remove(filepath.Join(b.Dir, boxdir.NetPorts))
	bin := o.Bin
	if bin == "" {
		if bin, err = netstack.FindHelper(); err != nil {
			return nil, err
		}
	}
	if err := boxdir.PrepareSockDir(b.Dir, b.ID, boxdir.NetSock, boxdir.NetControl); err != nil {
		return nil, err
	}
	hc := netstack.HelperConfig{
		Policy:        pol,
		Publish:       pub,
		Upstream:      o.Upstream,
		NetSocket:     b.sock(boxdir.NetSock),
		ControlSocket: b.sock(boxdir.NetControl),
		Log:           filepath.Join(b.Dir, boxdir.NetLog),
	}
	if hc.UID, err = helperUID(o); err != nil {
		return nil, fmt.Errorf("box %s network: %w", b.ID, err)
	}
	hc.GID = hc.UID
	if hc.UID != 0 {
		hc.Root = filepath.Join(b.Dir, boxdir.NetRoot)
		if err := os.MkdirAll(hc.Root, 0o700); err != nil {
			return nil, fmt.Errorf("box %s network: %w", b.ID, err)
		}
	}
	os.Remove(hc.NetSocket)
	inherit := o.Held.files()
	h, err := netstack.LaunchHelper(bin, filepath.Join(b.Dir, boxdir.NetConfig), filepath.Join(b.Dir, boxdir.NetStderr), hc, o.Secrets, inherit)
	for _, f := range inherit {
		f.Close() // the helper has its own, and Held the originals
	}
	if err != nil {
		return nil, fmt.Errorf("box %s network: %w", b.ID, err)
	}
	if err := os.WriteFile(filepath.Join(b.Dir, boxdir.NetPID), []byte(fmt.Sprintf("%d %d\n", h.Pid(), vmm.StartTime(h.Pid()))), 0o600); err != nil {
		// Unrecorded, nothing could find it to stop it.
		h.Kill()
		return nil, fmt.Errorf("box %s network: record its helper: %w", b.ID, err)
	}
	s = &Starting{box: b, o: o, h: h, cgroup: make(chan struct{})}
	go func() {
		defer close(s.cgroup)
		joinCgroup(b, o, h.Pid())
	}()
	return s, nil
}

// helperUID returns the uid (and gid, the same number) the box's network
// helper runs as once it is set up: one of the box uid range that no other
// process runs as (see confine.AllocUID), when airlock runs as root and
// confines its boxes; else 0 (the helper keeps the caller's uid).
func helperUID(o Options) (int, error) {
	if o.Unconfined || os.Geteuid() != 0 {
		return 0, nil
	}
	return confine.AllocBoxUID(o.UIDRange)
}

// joinCgroup puts the network helper pid in a cgroup of its own with the
// helper's limits (as root, where the host has cgroups), recorded in the
// box directory for Stop.
func joinCgroup(b Box, o Options, pid int) {
	if o.Unconfined || os.Geteuid() != 0 {
		return
	}
	g, err := confine.NewCgroup("net-"+b.ID, confine.Limits{MemoryBytes: Memory, Pids: Pids})
	if err != nil {
		o.warn("network helpers run without a cgroup: " + err.Error())
		return
	}
	if err := g.Add(pid); err != nil {
		g.Remove()
		return
	}
	confine.SaveCgroup(filepath.Join(b.Dir, boxdir.NetCgroup), g)
}

// Wait waits until the helper s (nil: none) is in its cgroup and serves
// the box, and records the published ports as bound (see Ports). On error
// the helper is stopped.
func (s *Starting) Wait(ctx context.Context) error {
	if s == nil {
		return nil
	}
	s.Joined()
	pub, err := s.h.Wait(ctx)
	if err != nil {
		Stop(s.box.Dir)
		return fmt.Errorf("box %s network: %w", s.box.ID, err)
	}
	if s.h.Unconfined != "" {
		s.o.warn(s.h.Unconfined)
	}
	var ports []port
	for _, p := range pub {
		ports = append(ports, port{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Protocol: p.Proto})
	}
	raw, _ := json.Marshal(ports)
	return os.WriteFile(filepath.Join(s.box.Dir, boxdir.NetPorts), raw, 0o600)
}

// port is a published port as the box directory records it (the JSON of
// airlock.PortMapping).
type port struct {
	HostIP    string `json:"host_ip,omitempty"`
	HostPort  int    `json:"host_port"`
	GuestPort int    `json:"guest_port"`
	Protocol  string `json:"protocol,omitempty"`
}

// Ports returns the published ports of the box in dir as its helper bound
// them at its last start (nil: none, or none recorded).
func Ports(dir string) []netstack.Publish {
	raw, err := os.ReadFile(filepath.Join(dir, boxdir.NetPorts))
	if err != nil {
		return nil
	}
	var ports []port
	json.Unmarshal(raw, &ports)
	var pub []netstack.Publish
	for _, p := range ports {
		pub = append(pub, netstack.Publish{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Proto: p.Protocol})
	}
	return pub
}

// Stop ends the network helper of the box in dir, if one runs (SIGTERM,
// then SIGKILL after a second), and removes its cgroup and record.
func Stop(dir string) {
	h, ok := recorded(dir)
	if !ok {
		return
	}
	if h.Alive() {
		syscall.Kill(h.PID, syscall.SIGTERM)
		deadline := time.Now().Add(time.Second)
		for h.Alive() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		vmm.Kill(h)
	}
	confine.RemoveSavedCgroup(filepath.Join(dir, boxdir.NetCgroup))
	os.Remove(filepath.Join(dir, boxdir.NetPID))
}

// recorded returns the recorded network helper of the box in dir (ok:
// one was recorded; it may have ended since).
func recorded(dir string) (h vmm.Handle, ok bool) {
	raw, err := os.ReadFile(filepath.Join(dir, boxdir.NetPID))
	if err != nil {
		return vmm.Handle{}, false
	}
	if _, err := fmt.Sscan(string(raw), &h.PID, &h.Start); err != nil || h.PID <= 0 {
		return vmm.Handle{}, false
	}
	return h, true
}

// PID reports the pid of the network helper of the box in dir and whether
// it runs.
func PID(dir string) (int, bool) {
	h, ok := recorded(dir)
	return h.PID, ok && h.Alive()
}

// Reconcile stops the network helper of the box in dir, whose machine is
// gone, unless someone holds the box's lock (a Start in progress: its
// helper runs before its machine does).
func Reconcile(dir string) {
	if _, err := os.Stat(filepath.Join(dir, boxdir.NetPID)); err != nil {
		return
	}
	fl := flock.New(filepath.Join(dir, boxdir.Lock))
	if ok, err := fl.TryLock(); err != nil || !ok {
		return
	}
	defer fl.Unlock()
	Stop(dir)
}

// Call sends req to the control socket of box b's helper (see
// netstack.Call).
func Call(ctx context.Context, b Box, req netstack.Request) (netstack.Response, error) {
	return netstack.Call(ctx, b.sock(boxdir.NetControl), req)
}

// Connect opens a TCP connection to port in box b's guest through its
// helper (see netstack.Connect).
func Connect(ctx context.Context, b Box, port int) (net.Conn, error) {
	return netstack.Connect(ctx, b.sock(boxdir.NetControl), port)
}
