package netstack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Publish is a published port: connections to HostIP:HostPort on the host
// are forwarded to the box's GuestPort.
type Publish struct {
	HostIP    string `json:"host_ip"`
	HostPort  int    `json:"host_port"` // 0: any free port (Net.Published says which)
	GuestPort int    `json:"guest_port"`
	Proto     string `json:"proto"` // "tcp" or "udp"
	// FD, when positive, is a listening TCP socket this process inherited
	// for the port (bound by its host process, which keeps it open while
	// the box is suspended: see helper.Held), used instead of binding
	// HostIP:HostPort; its pending connections are served.
	FD int `json:"fd,omitempty"`
}

func (p Publish) String() string {
	return net.JoinHostPort(p.HostIP, strconv.Itoa(p.HostPort)) + "->" + strconv.Itoa(p.GuestPort) + "/" + p.Proto
}

// Config configures a box's network.
type Config struct {
	Policy  Policy
	Publish []Publish
	// Upstream is the resolver (IP:PORT) allowed queries go to; "" means
	// DefaultUpstream().
	Upstream string
	// Log receives one line per denied attempt and per secret
	// substitution (nil: none).
	Log io.Writer
	// Secrets, when set, are substituted in the HTTPS requests to their
	// hosts (see interceptor); ExtraCA is a PEM file of CAs trusted
	// besides the host's roots for those hosts ("": none).
	Secrets *SecretConfig
	ExtraCA string
}

// Net is one box's network.
type Net struct {
	e        *Engine
	upstream string
	ic       *interceptor // nil: the box has no secrets

	published []Publish
	tcpLs     []net.Listener
	udpLs     []*net.UDPConn

	st    atomic.Pointer[stack.Stack] // while Serve runs
	link  atomic.Pointer[streamLink]  // while Serve runs
	pings atomic.Int32                // in flight

	closeOnce sync.Once
	done      chan struct{}
}

// Timeouts of flows.
const (
	dialTimeout = 30 * time.Second
	udpIdle     = 60 * time.Second
)

// New checks cfg and binds the published ports (a port in use is an error
// here, before any VM starts). Serve then runs the network.
func New(cfg Config) (*Net, error) {
	e, err := NewEngine(cfg.Policy, cfg.Log)
	if err != nil {
		return nil, err
	}
	n := &Net{e: e, upstream: cfg.Upstream, done: make(chan struct{})}
	if cfg.Secrets != nil && len(cfg.Secrets.Secrets) > 0 {
		if n.ic, err = newInterceptor(e, *cfg.Secrets, cfg.ExtraCA); err != nil {
			return nil, fmt.Errorf("secrets: %w", err)
		}
		e.bound = n.ic.bound
	}
	if n.upstream == "" {
		n.upstream = DefaultUpstream()
	}
	for _, p := range cfg.Publish {
		ip := p.HostIP
		if ip == "" {
			ip = "127.0.0.1"
		}
		addr := net.JoinHostPort(ip, strconv.Itoa(p.HostPort))
		switch p.Proto {
		case "tcp", "":
			l, err := listenTCP(addr, p.FD)
			if err != nil {
				n.Close()
				return nil, fmt.Errorf("publish %s: %w", addr, err)
			}
			p.FD = 0
			n.tcpLs = append(n.tcpLs, l)
			p.HostPort = l.Addr().(*net.TCPAddr).Port
			p.Proto = "tcp"
		case "udp":
			ua, err := net.ResolveUDPAddr("udp", addr)
			if err != nil {
				n.Close()
				return nil, fmt.Errorf("publish %s/udp: %w", addr, err)
			}
			c, err := net.ListenUDP("udp", ua)
			if err != nil {
				n.Close()
				return nil, fmt.Errorf("publish %s/udp: %w", addr, err)
			}
			n.udpLs = append(n.udpLs, c)
			p.HostPort = c.LocalAddr().(*net.UDPAddr).Port
		default:
			n.Close()
			return nil, fmt.Errorf("publish: protocol %q: want tcp or udp", p.Proto)
		}
		p.HostIP = ip
		n.published = append(n.published, p)
	}
	return n, nil
}

// listenTCP binds addr, or takes the inherited listening socket fd (when
// positive; net.FileListener makes a copy, and fd is closed).
func listenTCP(addr string, fd int) (net.Listener, error) {
	if fd <= 0 {
		return net.Listen("tcp", addr)
	}
	f := os.NewFile(uintptr(fd), "publish "+addr)
	if f == nil {
		return nil, fmt.Errorf("inherited descriptor %d: not open", fd)
	}
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("inherited descriptor %d: %w", fd, err)
	}
	if _, ok := l.(*net.TCPListener); !ok {
		l.Close()
		return nil, fmt.Errorf("inherited descriptor %d: not a TCP listener", fd)
	}
	return l, nil
}

// Engine returns the policy engine (to change the policy, read counters).
func (n *Net) Engine() *Engine { return n.e }

// Published returns the published ports with the host ports bound.
func (n *Net) Published() []Publish { return append([]Publish(nil), n.published...) }

// Close stops the published-port listeners and, if Serve runs, makes it
// return.
func (n *Net) Close() {
	n.closeOnce.Do(func() {
		close(n.done)
		for _, l := range n.tcpLs {
			l.Close()
		}
		for _, c := range n.udpLs {
			c.Close()
		}
	})
}

var stackMAC = tcpip.LinkAddress("\x52\x55\x0a\x00\x02\x02")

// Serve runs the network over conn, QEMU's end of the box's NIC, until
// QEMU closes it (the VM ended) or Close is called.
func (n *Net) Serve(conn net.Conn) error {
	defer n.Close()
	link := newStreamLink(conn, stackMAC)
	defer link.stop()
	n.link.Store(link)
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	n.st.Store(s)
	defer func() {
		s.Close()
		s.Wait()
	}()
	sack := tcpip.TCPSACKEnabled(true)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: 256 << 10, Max: 1 << 20}
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &rcv)
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: 256 << 10, Max: 1 << 20}
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &snd)
	mod := tcpip.TCPModerateReceiveBufferOption(true)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &mod)
	if err := s.CreateNIC(1, ethernet.New(link)); err != nil {
		return fmt.Errorf("create NIC: %s", err)
	}
	s.SetPromiscuousMode(1, true)
	s.SetSpoofing(1, true)
	for _, a := range []netip.Addr{GatewayAddr, DNSAddr} {
		pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(a.As4()), PrefixLen: BoxSubnet.Bits()}}
		if err := s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("address %s: %s", a, err)
		}
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: 1}})
	link.filter = n.filterFrame

	tf := tcp.NewForwarder(s, 0, 512, n.handleTCP)
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, tf.HandlePacket)
	uf := udp.NewForwarder(s, n.handleUDP)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, uf.HandlePacket)

	res := newResolver(n.e, n.upstream)
	var servers []*dns.Server
	for _, a := range []netip.Addr{DNSAddr, GatewayAddr} {
		fa := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(a.As4()), Port: 53}
		pc, err := gonet.DialUDP(s, &fa, nil, ipv4.ProtocolNumber)
		if err != nil {
			return fmt.Errorf("DNS on %s: %w", a, err)
		}
		tl, err := gonet.ListenTCP(s, fa, ipv4.ProtocolNumber)
		if err != nil {
			return fmt.Errorf("DNS on %s: %w", a, err)
		}
		dl := &flowListener{Listener: tl, e: n.e, dst: netip.AddrPortFrom(a, 53)}
		for _, srv := range []*dns.Server{{PacketConn: pc, Handler: res}, {Listener: dl, Handler: res, ReadTimeout: 10 * time.Second}} {
			servers = append(servers, srv)
			go srv.ActivateAndServe()
		}
	}
	defer func() {
		for _, srv := range servers {
			srv.Shutdown()
		}
	}()

	ti, ui := 0, 0 // tcpLs and udpLs are in the order of published
	for _, p := range n.published {
		if p.Proto == "udp" {
			go n.servePublishedUDP(s, n.udpLs[ui], p.GuestPort)
			ui++
		} else {
			go n.servePublishedTCP(s, n.tcpLs[ti], p.GuestPort)
			ti++
		}
	}

	errc := make(chan error, 1)
	go func() { errc <- link.readLoop() }()
	select {
	case err := <-errc:
		return err
	case <-n.done:
		conn.Close()
		return nil
	}
}

// filterFrame takes ICMP echo requests to anything but the gateway
// addresses out of the stack (see handleEcho).
func (n *Net) filterFrame(f []byte) bool {
	if len(f) < header.EthernetMinimumSize+header.IPv4MinimumSize+1 {
		return false
	}
	if binary.BigEndian.Uint16(f[12:14]) != uint16(header.IPv4ProtocolNumber) {
		return false
	}
	ip := header.IPv4(f[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) || ip.Protocol() != uint8(header.ICMPv4ProtocolNumber) {
		return false
	}
	dst := netip.AddrFrom4(ip.DestinationAddress().As4())
	if dst == GatewayAddr || dst == DNSAddr {
		return false
	}
	p := ip.Payload()
	if len(p) > 0 && header.ICMPv4Type(p[0]) == header.ICMPv4Echo {
		n.handleEcho(f, dst)
		return true
	}
	return false
}

func addrOf(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip
}

func (n *Net) handleTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst := netip.AddrPortFrom(addrOf(id.LocalAddress), id.LocalPort)
	v := n.e.Check("tcp", dst)
	if v.Allow {
		if why := n.e.admit(); why != "" {
			v = deny(why)
		}
	}
	if !v.Allow {
		n.e.Deny("tcp", dst.String(), v.Reason)
		r.Complete(true)
		return
	}
	out, err := dialTCP(v.Dial)
	if err != nil {
		r.Complete(true)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		out.Close()
		return
	}
	r.Complete(false)
	in := gonet.NewTCPConn(&wq, ep)
	f := &flow{proto: "tcp", dst: dst, close: func() { in.Close(); out.Close() }}
	untrack := n.e.track(f)
	defer untrack()
	if n.ic != nil && dst.Port() == 443 {
		if names := n.e.BoundNames(dst.Addr()); len(names) > 0 {
			n.ic.handle(in, out, v.Dial, names)
			in.Close()
			out.Close()
			return
		}
	}
	relayTCP(in, out, &n.e.bytesOut, &n.e.bytesIn)
}

// dialTCP connects to addr from the host. Loopback destinations (host
// ports) are connected with a blocking connect(2), which the kernel
// completes at once, instead of a non-blocking one whose completion the Go
// runtime's poller would notice only at its next look, a millisecond or
// more later on a busy host. Other destinations take longer than that
// anyway.
func dialTCP(addr netip.AddrPort) (net.Conn, error) {
	if !addr.Addr().Is4() || !addr.Addr().IsLoopback() {
		// Dial, not DialContext: no goroutine to watch a context.
		return (&net.Dialer{Timeout: dialTimeout}).Dial("tcp", addr.String())
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// Bound the connect: a full listen backlog makes it wait.
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 5})
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}); err != nil {
		unix.Close(fd)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(addr), Err: err}
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{})
	f := os.NewFile(uintptr(fd), "tcp "+addr.String())
	defer f.Close()
	return net.FileConn(f)
}

// halfCloser is a connection whose write side can be closed alone.
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// relayTCP copies a to b and b to a until both directions end, counting
// the bytes (a->b in ab, b->a in ba), then closes both.
func relayTCP(a, b net.Conn, ab, ba *atomic.Uint64) {
	var wg sync.WaitGroup
	wg.Add(2)
	cp := func(dst, src net.Conn, cnt *atomic.Uint64) {
		defer wg.Done()
		buf := make([]byte, 64<<10)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				cnt.Add(uint64(k))
				if _, werr := dst.Write(buf[:k]); werr != nil {
					dst.Close()
					src.Close()
					return
				}
			}
			if err != nil {
				if hc, ok := dst.(halfCloser); ok && errors.Is(err, io.EOF) {
					hc.CloseWrite()
				} else {
					dst.Close()
					src.Close()
				}
				return
			}
		}
	}
	go cp(b, a, ab)
	go cp(a, b, ba)
	wg.Wait()
	a.Close()
	b.Close()
}

func (n *Net) handleUDP(r *udp.ForwarderRequest) bool {
	id := r.ID()
	dst := netip.AddrPortFrom(addrOf(id.LocalAddress), id.LocalPort)
	v := n.e.Check("udp", dst)
	if v.Allow {
		if why := n.e.admit(); why != "" {
			v = deny(why)
		}
	}
	if !v.Allow {
		n.e.Deny("udp", dst.String(), v.Reason)
		return true
	}
	out, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(v.Dial))
	if err != nil {
		return true
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		out.Close()
		return true
	}
	in := gonet.NewUDPConn(&wq, ep)
	f := &flow{proto: "udp", dst: dst, close: func() { in.Close(); out.Close() }}
	untrack := n.e.track(f)
	go func() {
		defer untrack()
		relayUDP(in, out, &n.e.bytesOut, &n.e.bytesIn)
	}()
	return true
}

// relayUDP copies datagrams between a and b until neither has sent one for
// udpIdle, then closes both.
func relayUDP(a, b net.Conn, ab, ba *atomic.Uint64) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{})
	var once sync.Once
	stop := func() { once.Do(func() { close(done); a.Close(); b.Close() }) }
	cp := func(dst, src net.Conn, cnt *atomic.Uint64) {
		buf := make([]byte, 65536)
		for {
			src.SetReadDeadline(time.Now().Add(udpIdle))
			k, err := src.Read(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < udpIdle {
					continue
				}
				stop()
				return
			}
			last.Store(time.Now().UnixNano())
			cnt.Add(uint64(k))
			dst.Write(buf[:k])
		}
	}
	go cp(b, a, ab)
	cp(a, b, ba)
	<-done
}

func guestAddr(port int) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(GuestAddr.As4()), Port: uint16(port)}
}

// dialGuest opens a TCP connection to port in the guest (Connect), within
// 10 s.
func (n *Net) dialGuest(port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: want 1-65535", port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := n.st.Load()
	for s == nil { // Serve not yet running: the machine is starting
		select {
		case <-ctx.Done():
			return nil, errors.New("the network is not up")
		case <-time.After(10 * time.Millisecond):
		}
		s = n.st.Load()
	}
	in, err := gonet.DialContextTCP(ctx, s, guestAddr(port), ipv4.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("connecting to port %d in the box: %w", port, err)
	}
	return in, nil
}

func (n *Net) servePublishedTCP(s *stack.Stack, l net.Listener, guestPort int) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			in, err := gonet.DialContextTCP(ctx, s, guestAddr(guestPort), ipv4.ProtocolNumber)
			cancel()
			if err != nil {
				c.Close()
				return
			}
			n.e.conns.Add(1)
			relayTCP(c, in, &n.e.bytesIn, &n.e.bytesOut)
		}()
	}
}

// servePublishedUDP forwards datagrams from host clients to the box's
// guestPort, one flow per client address (at most 256 at once).
func (n *Net) servePublishedUDP(s *stack.Stack, l *net.UDPConn, guestPort int) {
	var mu sync.Mutex
	flows := map[netip.AddrPort]*gonet.UDPConn{}
	buf := make([]byte, 65536)
	for {
		k, from, err := l.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		mu.Lock()
		c := flows[from]
		if c == nil && len(flows) < 256 {
			ga := guestAddr(guestPort)
			c, err = gonet.DialUDP(s, nil, &ga, ipv4.ProtocolNumber)
			if err == nil {
				flows[from] = c
				go func(c *gonet.UDPConn, from netip.AddrPort) {
					rb := make([]byte, 65536)
					for {
						c.SetReadDeadline(time.Now().Add(udpIdle))
						m, err := c.Read(rb)
						if err != nil {
							break
						}
						n.e.bytesOut.Add(uint64(m))
						l.WriteToUDPAddrPort(rb[:m], from)
					}
					c.Close()
					mu.Lock()
					delete(flows, from)
					mu.Unlock()
				}(c, from)
			}
		}
		mu.Unlock()
		if c != nil {
			n.e.bytesIn.Add(uint64(k))
			c.Write(buf[:k])
		}
	}
}

// ParsePublish parses a published port in Docker's syntax:
// [HOSTIP:]HOSTPORT:GUESTPORT[/tcp|/udp]. HOSTIP defaults to 127.0.0.1,
// HOSTPORT 0 picks a free port.
func ParsePublish(s string) (Publish, error) {
	orig := s
	p := Publish{Proto: "tcp"}
	if i := strings.LastIndex(s, "/"); i >= 0 {
		p.Proto = strings.ToLower(s[i+1:])
		s = s[:i]
		if p.Proto != "tcp" && p.Proto != "udp" {
			return Publish{}, fmt.Errorf("publish %q: protocol %q: want tcp or udp", orig, p.Proto)
		}
	}
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return Publish{}, fmt.Errorf("publish %q: want [HOSTIP:]HOSTPORT:GUESTPORT[/tcp|udp]", orig)
	}
	guest, rest := s[i+1:], s[:i]
	host := rest
	if j := strings.LastIndex(rest, ":"); j >= 0 {
		p.HostIP, host = strings.Trim(rest[:j], "[]"), rest[j+1:]
		if _, err := netip.ParseAddr(p.HostIP); err != nil {
			return Publish{}, fmt.Errorf("publish %q: host IP %q is not an IP address", orig, p.HostIP)
		}
	}
	hp, err := strconv.Atoi(host)
	if err != nil || hp < 0 || hp > 65535 {
		return Publish{}, fmt.Errorf("publish %q: host port %q out of range (want 0-65535; 0 picks a free one)", orig, host)
	}
	gp, err := strconv.Atoi(guest)
	if err != nil || gp < 1 || gp > 65535 {
		return Publish{}, fmt.Errorf("publish %q: guest port %q out of range (want 1-65535)", orig, guest)
	}
	p.HostPort, p.GuestPort = hp, gp
	if p.HostIP == "" {
		p.HostIP = "127.0.0.1"
	}
	return p, nil
}
