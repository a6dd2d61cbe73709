package netstack

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-run/airlock/internal/defaults"
)

// UpstreamEnv names the environment variable that sets the upstream
// resolver (IP:PORT) the box's DNS queries go to; default: the first
// nameserver of the host's /etc/resolv.conf.
const UpstreamEnv = defaults.DNSUpstreamEnv

// DefaultUpstream returns $AIRLOCK_DNS_UPSTREAM, else the first nameserver
// in /etc/resolv.conf (port 53), else "".
func DefaultUpstream() string {
	if u := defaults.DNSUpstream(); u != "" {
		return u
	}
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "nameserver" {
			if a, err := netip.ParseAddr(fs[1]); err == nil {
				return netip.AddrPortFrom(a.WithZone(""), 53).String()
			}
		}
	}
	return ""
}

// resolver answers the box's DNS queries: names the policy does not allow
// get NXDOMAIN without any query leaving the host; allowed ones are
// forwarded upstream and their answers vetted (Engine.Resolved) so that no
// name resolves to an address the box must not reach.
type resolver struct {
	e        *Engine
	upstream string
	sem      chan struct{} // bounds concurrent upstream queries
}

func newResolver(e *Engine, upstream string) *resolver {
	return &resolver{e: e, upstream: upstream, sem: make(chan struct{}, 64)}
}

func (r *resolver) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := r.answer(q)
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp || w.RemoteAddr().Network() == "udp" {
		// What fits the client's buffer (512 bytes, or its EDNS size);
		// Truncate sets TC so that it asks again over TCP.
		size := dns.MinMsgSize
		if o := q.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

// answer builds the reply to q.
func (r *resolver) answer(q *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	if len(q.Question) != 1 || q.Opcode != dns.OpcodeQuery {
		return m.SetRcode(q, dns.RcodeFormatError)
	}
	r.e.queries.Add(1)
	qn := q.Question[0]
	name := strings.TrimSuffix(strings.ToLower(qn.Name), ".")
	if name == HostName {
		m.SetReply(q)
		m.Authoritative = true
		if qn.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: qn.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.IP(GatewayAddr.AsSlice())})
		}
		return m
	}
	if !r.e.NameAllowed(name) {
		r.e.Deny("dns", name, "name not in allowlist")
		m.SetRcode(q, dns.RcodeNameError)
		return m
	}
	if qn.Qtype == dns.TypeAAAA {
		// The box has no IPv6: an empty answer makes clients use IPv4 at once.
		return m.SetReply(q)
	}
	if r.upstream == "" {
		return m.SetRcode(q, dns.RcodeServerFailure)
	}
	select {
	case r.sem <- struct{}{}:
		defer func() { <-r.sem }()
	default:
		return m.SetRcode(q, dns.RcodeServerFailure)
	}
	fwd := q.Copy()
	fwd.Id = dns.Id()
	clientEDNS := q.IsEdns0() != nil
	if !clientEDNS {
		// Ask for answers up to 4 KiB over UDP; ServeDNS truncates what
		// does not fit the client's 512 bytes.
		fwd.SetEdns0(4096, false)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second, UDPSize: 4096}
	resp, _, err := c.ExchangeContext(ctx, fwd, r.upstream)
	if err == nil && resp.Truncated {
		c.Net = "tcp"
		resp, _, err = c.ExchangeContext(ctx, fwd, r.upstream)
	}
	if err != nil || resp == nil {
		return m.SetRcode(q, dns.RcodeServerFailure)
	}
	resp.Id = q.Id
	var kept []dns.RR
	addrs, refused := 0, ""
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			addrs++
			a, _ := netip.AddrFromSlice(rr.A)
			if why := r.e.Resolved(name, a); why != "" {
				refused = why
				continue
			}
		case *dns.AAAA:
			continue
		}
		kept = append(kept, rr)
	}
	resp.Answer = kept
	resp.Extra = filterAddrs(resp.Extra)
	if !clientEDNS {
		resp.Extra = slices.DeleteFunc(resp.Extra, func(rr dns.RR) bool { return rr.Header().Rrtype == dns.TypeOPT })
	}
	resp.Ns = filterAddrs(resp.Ns)
	if refused != "" && !hasA(kept) {
		r.e.Deny("dns", name, "resolves to "+refused+" (rebinding)")
		return m.SetRcode(q, dns.RcodeRefused)
	}
	return resp
}

// filterAddrs drops address records (glue) from a section.
func filterAddrs(rrs []dns.RR) []dns.RR {
	out := rrs[:0]
	for _, rr := range rrs {
		switch rr.(type) {
		case *dns.A, *dns.AAAA:
			continue
		}
		out = append(out, rr)
	}
	return out
}

func hasA(rrs []dns.RR) bool {
	for _, rr := range rrs {
		if _, ok := rr.(*dns.A); ok {
			return true
		}
	}
	return false
}

// flowListener admits the box's TCP connections to a service of the
// gateway itself (its resolver) as the flows they are: each counts against
// maxFlows and the new-flow rate while it is open, and one beyond them is
// closed at once and counted as denied, so that a box cannot hold more
// connections, or open them faster, on the gateway than anywhere else.
type flowListener struct {
	net.Listener
	e   *Engine
	dst netip.AddrPort
}

// Accept returns the next admitted connection; refused ones are closed
// without reaching the caller.
func (l *flowListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if why := l.e.admit(); why != "" {
			l.e.Deny("tcp", l.dst.String(), why)
			c.Close()
			continue
		}
		fc := &flowConn{Conn: c}
		fc.untrack = l.e.track(&flow{proto: "tcp", dst: l.dst, gateway: true, close: func() { c.Close() }})
		return fc, nil
	}
}

// flowConn is an admitted connection that leaves the flow count when it
// is closed.
type flowConn struct {
	net.Conn
	once    sync.Once
	untrack func()
}

func (c *flowConn) Close() error {
	c.once.Do(c.untrack)
	return c.Conn.Close()
}
