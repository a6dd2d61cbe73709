package netstack

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// These tests run the box's network in-process against a second gVisor
// stack standing in for the guest kernel (10.0.2.15/24, default route via
// 10.0.2.2, the addresses the VM tests' guests get), over a real unix
// socket with QEMU's stream framing. The "internet" is 198.18.0.0/24,
// which TestInternetEnv (a test-only override) has the network reach on
// 127.0.0.0/24 (198.18.0.2 is a server on 127.0.0.2), so that no packet
// leaves the host; the host's loopback services are on 127.0.0.1. The VM tests in the root
// package run the same helper against a real QEMU guest.

// testUpstream is a DNS server on loopback that counts the queries it
// gets and answers A records from zone.
type testUpstream struct {
	addr    string
	queries atomic.Int64
	zone    map[string]string
}

func startUpstream(t *testing.T, zone map[string]string) *testUpstream {
	u := &testUpstream{zone: zone}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		u.queries.Add(1)
		m := new(dns.Msg).SetReply(q)
		name := strings.TrimSuffix(q.Question[0].Name, ".")
		if name == "big.test" { // 40 addresses: more than 512 bytes
			for i := 1; i <= 40; i++ {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(198, 18, 0, byte(i))})
			}
		} else if ip, ok := u.zone[name]; ok && q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP(ip)})
		} else if !ok {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return u
}

// guest is the stand-in guest: a gVisor stack wired to a Net.
type guest struct {
	s   *stack.Stack
	n   *Net
	log *syncWriter
}

func startNet(t testing.TB, cfg Config) *guest {
	t.Helper()
	logw := &syncWriter{}
	cfg.Log = logw
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "n.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	gc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- n.Serve(nc) }()
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	link := newStreamLink(gc, tcpip.LinkAddress("\x52\x54\x00\x12\x34\x56"))
	if err := s.CreateNIC(1, ethernet.New(link)); err != nil {
		t.Fatal(err)
	}
	s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(GuestAddr.As4()), PrefixLen: 24}}, stack.AddressProperties{})
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(GatewayAddr.As4()), NIC: 1}})
	go link.readLoop()
	t.Cleanup(func() {
		gc.Close()
		select {
		case <-served:
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after the guest's connection closed")
		}
		s.Close()
	})
	return &guest{s: s, n: n, log: logw}
}

// syncWriter serializes writes to a buffer the test reads after the fact.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// waitFor reports whether want appears in the log within d.
func (s *syncWriter) waitFor(want string, d time.Duration) bool {
	for deadline := time.Now().Add(d); !strings.Contains(s.String(), want); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (g *guest) dial(t testing.TB, dst string) (net.Conn, error) {
	t.Helper()
	a := netip.MustParseAddrPort(dst)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := gonet.DialContextTCP(ctx, g.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(a.Addr().As4()), Port: a.Port()}, ipv4.ProtocolNumber)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// query asks the box's resolver over UDP.
func (g *guest) query(t *testing.T, name string, qtype uint16) *dns.Msg {
	t.Helper()
	ra := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(DNSAddr.As4()), Port: 53}
	pc, err := gonet.DialUDP(g.s, nil, &ra, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	co := &dns.Conn{Conn: pc}
	q := new(dns.Msg).SetQuestion(dns.Fqdn(name), qtype)
	pc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := co.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	r, err := co.ReadMsg()
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	return r
}

// server listens on addr and greets every connection with greeting.
func server(t *testing.T, addr, greeting string) int {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				c.Write([]byte(greeting + "\n"))
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func readLine(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	s, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return strings.TrimSpace(s)
}

func TestPublicNet(t *testing.T) {
	t.Setenv(TestInternetEnv, "198.18.0.0/24")
	inet := server(t, "127.0.0.2:0", "hello from the internet")
	hostOnly := server(t, "127.0.0.1:0", "host secret")
	allowed := server(t, "127.0.0.1:0", "allowed host port")
	up := startUpstream(t, map[string]string{"example.test": "198.18.0.2", "rebind.test": "127.0.0.1", "private.test": "10.1.2.3"})
	cl, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := cl.Addr().(*net.TCPAddr).Port // opened to the box, but nothing listens
	cl.Close()
	g := startNet(t, Config{Policy: Policy{Mode: ModePublic, HostPorts: []int{allowed, closed}}, Upstream: up.addr})

	c, err := g.dial(t, "198.18.0.2:"+strconv.Itoa(inet))
	if err != nil {
		t.Fatalf("internet: %v", err)
	}
	if got := readLine(t, c); got != "hello from the internet" {
		t.Errorf("internet said %q", got)
	}
	c.Write([]byte("0123456789"))
	// Half-close and wait for the server's close: it reads to EOF, so the
	// bytes went through (and were counted) before the stats below.
	c.(*gonet.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.Copy(io.Discard, c)
	c.Close()

	for _, dst := range []string{"10.0.2.2:" + strconv.Itoa(hostOnly), "10.0.2.3:" + strconv.Itoa(hostOnly)} {
		if c, err := g.dial(t, dst); err == nil {
			c.Close()
			t.Errorf("guest reached host-only service at %s", dst)
		}
	}
	t0 := time.Now()
	if c, err := g.dial(t, "10.0.2.2:"+strconv.Itoa(closed)); err == nil {
		c.Close()
		t.Error("connected to an allowed host port where nothing listens")
	} else if !strings.Contains(err.Error(), "refused") || time.Since(t0) > 5*time.Second {
		t.Errorf("allowed host port where nothing listens: %v after %s, want connection refused at once", err, time.Since(t0))
	}
	c, err = g.dial(t, "10.0.2.2:"+strconv.Itoa(allowed))
	if err != nil {
		t.Fatalf("allowed host port: %v", err)
	}
	if got := readLine(t, c); got != "allowed host port" {
		t.Errorf("host port said %q", got)
	}
	c.Close()

	if r := g.query(t, HostName, dns.TypeA); len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != GatewayAddr.String() {
		t.Errorf("%s: %v", HostName, r)
	}
	if r := g.query(t, "example.test", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("example.test: %v", r)
	}
	for _, n := range []string{"rebind.test", "private.test"} {
		if r := g.query(t, n, dns.TypeA); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("%s (rebinding): rcode %s, %d answers", n, dns.RcodeToString[r.Rcode], len(r.Answer))
		}
	}
	// An answer too big for a plain UDP reply is truncated (TC set), and
	// comes whole over TCP.
	if r := g.query(t, "big.test", dns.TypeA); !r.Truncated || len(r.Answer) >= 40 {
		t.Errorf("big.test over UDP: truncated %v, %d answers", r.Truncated, len(r.Answer))
	}
	tc, err := g.dial(t, DNSAddr.String()+":53")
	if err != nil {
		t.Fatal(err)
	}
	co := &dns.Conn{Conn: tc}
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	co.WriteMsg(new(dns.Msg).SetQuestion("big.test.", dns.TypeA))
	if r, err := co.ReadMsg(); err != nil || r.Truncated || len(r.Answer) != 40 {
		t.Errorf("big.test over TCP: %v, %v", r, err)
	}
	tc.Close()
	st := g.n.Engine().Stats()
	if st.BytesOut < 10 || st.BytesIn < 20 {
		t.Errorf("bytes out %d, in %d", st.BytesOut, st.BytesIn)
	}
	if st.Denied < 4 {
		t.Errorf("denied = %d, want >= 4", st.Denied)
	}
	for _, want := range []string{"tcp 10.0.2.2:" + strconv.Itoa(hostOnly) + " denied: gateway", "dns rebind.test denied"} {
		if !strings.Contains(g.log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, g.log)
		}
	}
}

func TestAllowlistNet(t *testing.T) {
	t.Setenv(TestInternetEnv, "198.18.0.0/24")
	inet := server(t, "127.0.0.2:0", "allowed site")
	other := server(t, "127.0.0.3:0", "unlisted site")
	up := startUpstream(t, map[string]string{"allowed.test": "198.18.0.2", "unlisted.test": "198.18.0.3", "rebind.allowed.test": "127.0.0.1"})
	g := startNet(t, Config{Policy: Policy{Mode: ModeAllowlist, Allow: []string{"allowed.test", "*.allowed.test"}}, Upstream: up.addr})

	if c, err := g.dial(t, "198.18.0.2:"+strconv.Itoa(inet)); err == nil {
		c.Close()
		t.Fatal("reached an allowed name's address before resolving it")
	}
	if r := g.query(t, "unlisted.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("unlisted.test: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	if n := up.queries.Load(); n != 0 {
		t.Fatalf("upstream got %d queries for an unlisted name", n)
	}
	if r := g.query(t, "allowed.test", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("allowed.test: %v", r)
	}
	c, err := g.dial(t, "198.18.0.2:"+strconv.Itoa(inet))
	if err != nil {
		t.Fatalf("allowed site: %v", err)
	}
	if got := readLine(t, c); got != "allowed site" {
		t.Errorf("got %q", got)
	}
	if c, err := g.dial(t, "198.18.0.3:"+strconv.Itoa(other)); err == nil {
		c.Close()
		t.Error("reached the unlisted name's address")
	}
	// Over TCP too.
	tc, err := g.dial(t, DNSAddr.String()+":53")
	if err != nil {
		t.Fatalf("DNS over TCP: %v", err)
	}
	co := &dns.Conn{Conn: tc}
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	co.WriteMsg(new(dns.Msg).SetQuestion("unlisted.test.", dns.TypeA))
	if r, err := co.ReadMsg(); err != nil || r.Rcode != dns.RcodeNameError {
		t.Errorf("unlisted.test over TCP: %v, %v", r, err)
	}
	tc.Close()
	if r := g.query(t, "rebind.allowed.test", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Errorf("rebind.allowed.test: rcode %s, want REFUSED", dns.RcodeToString[r.Rcode])
	}
	// DNS to another server is refused, even to an allowed address.
	ra := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4([4]byte{198, 18, 0, 2}), Port: 53}
	if pc, err := gonet.DialUDP(g.s, nil, &ra, ipv4.ProtocolNumber); err == nil {
		pc.Write([]byte("exfiltrate"))
		pc.Close()
	}

	// A policy change closes the open connection to what it no longer allows.
	closed, err := g.n.Engine().SetPolicy(Policy{Mode: ModeAllowlist, Allow: []string{"other.test"}})
	if err != nil || closed != 1 {
		t.Fatalf("SetPolicy: closed %d, %v", closed, err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 10)); err == nil {
		t.Error("connection still open after the policy denied it")
	}
	c.Close()
	// The refused datagram had no answer: its log line comes when the
	// stack has handled it.
	if !g.log.waitFor("udp 198.18.0.2:53 denied: DNS server other than the box's resolver", 10*time.Second) {
		t.Errorf("log lacks the refused DNS flow:\n%s", g.log)
	}
}

func TestPublishedPort(t *testing.T) {
	g := startNet(t, Config{Policy: Policy{Mode: ModePublic}, Publish: []Publish{{GuestPort: 8080, Proto: "tcp"}}})
	pub := g.n.Published()
	if len(pub) != 1 || pub[0].HostPort == 0 || pub[0].HostIP != "127.0.0.1" {
		t.Fatalf("published %+v", pub)
	}
	l, err := gonet.ListenTCP(g.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(GuestAddr.As4()), Port: 8080}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("hello from the box\n"))
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", net.JoinHostPort(pub[0].HostIP, strconv.Itoa(pub[0].HostPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := readLine(t, c); got != "hello from the box" {
		t.Errorf("got %q", got)
	}
	// UDP: a datagram to the host port reaches the box's port, and the
	// box's answer comes back.
	g2 := startNet(t, Config{Policy: Policy{Mode: ModePublic}, Publish: []Publish{{GuestPort: 5353, Proto: "udp"}, {GuestPort: 8081, Proto: "tcp"}}})
	up := g2.n.Published()[0]
	la := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(GuestAddr.As4()), Port: 5353}
	gu, err := gonet.DialUDP(g2.s, &la, nil, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer gu.Close()
	go func() {
		buf := make([]byte, 100)
		gu.SetReadDeadline(time.Now().Add(10 * time.Second))
		k, from, err := gu.ReadFrom(buf)
		if err == nil {
			gu.WriteTo(append([]byte("box got "), buf[:k]...), from)
		}
	}()
	hc, err := net.Dial("udp", net.JoinHostPort(up.HostIP, strconv.Itoa(up.HostPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	hc.Write([]byte("ping"))
	hc.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 100)
	if k, err := hc.Read(buf); err != nil || string(buf[:k]) != "box got ping" {
		t.Errorf("published UDP port: %q, %v", buf[:k], err)
	}
	// The TCP port published after it goes to its own guest port.
	l2, err := gonet.ListenTCP(g2.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(GuestAddr.As4()), Port: 8081}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	go func() {
		if c, err := l2.Accept(); err == nil {
			c.Write([]byte("port 8081\n"))
			c.Close()
		}
	}()
	tp := g2.n.Published()[1]
	c2, err := net.Dial("tcp", net.JoinHostPort(tp.HostIP, strconv.Itoa(tp.HostPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got := readLine(t, c2); got != "port 8081" {
		t.Errorf("second published port: %q", got)
	}

	// The same port again is a clear error.
	_, err = New(Config{Policy: Policy{Mode: ModePublic}, Publish: []Publish{{HostIP: "127.0.0.1", HostPort: pub[0].HostPort, GuestPort: 80, Proto: "tcp"}}})
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("port in use: %v", err)
	}
}

// TestConnect: a control connection with op "connect" becomes a TCP
// connection to the guest's port (both ways, half-close carried); a port
// nothing listens on, or out of range, is an error.
func TestConnect(t *testing.T) {
	g := startNet(t, Config{Policy: Policy{Mode: ModePublic}})
	ctl := filepath.Join(t.TempDir(), "ctl.sock")
	cl, err := net.Listen("unix", ctl)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	go serveControl(cl, g.n)
	l, err := gonet.ListenTCP(g.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(GuestAddr.As4()), Port: 9000}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		b, _ := io.ReadAll(c) // until the host half-closes
		c.Write(append([]byte("box got: "), b...))
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Connect(ctx, ctl, 9000)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("ping"))
	c.(interface{ CloseWrite() error }).CloseWrite()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "box got: ping" {
		t.Errorf("through Connect: %q, %v", got, err)
	}
	if _, err := Connect(ctx, ctl, 9001); err == nil || !strings.Contains(err.Error(), "port 9001") {
		t.Errorf("a port nothing listens on: %v", err)
	}
	if _, err := Connect(ctx, ctl, 70000); err == nil {
		t.Error("port 70000 was taken")
	}
}
