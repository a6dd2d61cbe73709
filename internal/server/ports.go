package server

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/airlock-run/airlock"
)

// PortSpec is a published port (airlock.PortMapping, Docker's -p):
// connections to HostIP:HostPort on the server's host reach GuestPort in
// the box.
type PortSpec struct {
	HostIP    string `json:"host_ip,omitempty" maxLength:"64" doc:"Host address to listen on (default 127.0.0.1; 0.0.0.0 or :: for every interface). Must be granted by airlock serve --allow-publish."`
	HostPort  int    `json:"host_port" required:"false" minimum:"0" maximum:"65535" doc:"Host port; 0 picks a free one at each start (the box's ports then show the one bound). Must be granted by airlock serve --allow-publish."`
	GuestPort int    `json:"guest_port" minimum:"1" maximum:"65535" doc:"Port in the box."`
	Protocol  string `json:"protocol,omitempty" enum:"tcp,udp" default:"tcp" doc:"tcp (default) or udp."`
}

func portSpecOf(p airlock.PortMapping) PortSpec {
	return PortSpec{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Protocol: p.Protocol}
}

// PublishGrant is a range of host ports on one host address that API
// clients may publish (airlock serve --allow-publish ADDR:LOW-HIGH).
type PublishGrant struct {
	// Addr is the host address the grant covers. An unspecified address
	// (0.0.0.0, ::) covers itself and every address of its family; any
	// other covers only itself (127.0.0.1 does not cover 127.0.0.2).
	Addr netip.Addr
	// Low and High bound the host ports granted, inclusive. A range that
	// starts at 0 also grants host_port 0 (a free port the kernel picks,
	// which may lie outside the range).
	Low, High int
	// Protocol is "tcp", "udp" or "" for both.
	Protocol string
}

// String returns the grant in the syntax ParsePublishGrant reads.
func (g PublishGrant) String() string {
	s := g.Addr.String()
	if g.Addr.Is6() {
		s = "[" + s + "]"
	}
	s += ":" + strconv.Itoa(g.Low)
	if g.High != g.Low {
		s += "-" + strconv.Itoa(g.High)
	}
	if g.Protocol != "" {
		s += "/" + g.Protocol
	}
	return s
}

// ParsePublishGrant parses a --allow-publish value:
// [ADDR:]PORT[-PORT][/tcp|/udp], ADDR an IP address (IPv6 in brackets),
// 127.0.0.1 when left out. "8000-8099" grants 127.0.0.1's ports 8000 to
// 8099 over TCP and UDP; "0" grants host_port 0 (a free port) on
// 127.0.0.1; "0.0.0.0:8080/tcp" grants TCP port 8080 on every interface.
func ParsePublishGrant(s string) (PublishGrant, error) {
	orig := s
	var g PublishGrant
	if i := strings.LastIndex(s, "/"); i >= 0 {
		g.Protocol = strings.ToLower(s[i+1:])
		s = s[:i]
		if g.Protocol != "tcp" && g.Protocol != "udp" {
			return PublishGrant{}, fmt.Errorf("--allow-publish %q: protocol %q: want tcp or udp (or none for both)", orig, g.Protocol)
		}
	}
	addr, ports := "127.0.0.1", s
	if i := strings.LastIndex(s, ":"); i >= 0 {
		addr, ports = strings.TrimSuffix(strings.TrimPrefix(s[:i], "["), "]"), s[i+1:]
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || a.Zone() != "" {
		return PublishGrant{}, fmt.Errorf("--allow-publish %q: %q is not an IP address: want [ADDR:]PORT[-PORT][/tcp|udp]", orig, addr)
	}
	g.Addr = a.Unmap()
	lo, hi, ok := strings.Cut(ports, "-")
	if !ok {
		hi = lo
	}
	if g.Low, err = strconv.Atoi(lo); err == nil {
		g.High, err = strconv.Atoi(hi)
	}
	if err != nil || g.Low < 0 || g.High > 65535 || g.Low > g.High {
		return PublishGrant{}, fmt.Errorf("--allow-publish %q: ports %q: want PORT or LOW-HIGH within 0-65535 (0: a free port the kernel picks)", orig, ports)
	}
	return g, nil
}

// covers reports whether g grants publishing host port port of protocol
// proto on addr.
func (g PublishGrant) covers(addr netip.Addr, port int, proto string) bool {
	if g.Protocol != "" && g.Protocol != proto {
		return false
	}
	if port < g.Low || port > g.High {
		return false
	}
	if g.Addr == addr {
		return true
	}
	return g.Addr.IsUnspecified() && g.Addr.Is4() == addr.Is4()
}

// checkPorts applies p.AllowPublish (the request's tenant's) to the published ports of a
// create request, filling in their defaults (127.0.0.1, tcp).
func (s *Server) checkPorts(p Policy, opts *airlock.BoxOptions) error {
	grants := p.AllowPublish
	for i, p := range opts.Ports {
		if p.HostIP == "" {
			p.HostIP = "127.0.0.1"
		}
		if p.Protocol == "" {
			p.Protocol = "tcp"
		}
		a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(p.HostIP, "["), "]"))
		if err != nil || a.Zone() != "" {
			return invalidField(fmt.Sprintf("/ports/%d/host_ip", i),
				fmt.Sprintf("ports[%d].host_ip %q is not an IP address (127.0.0.1, 0.0.0.0, ::1, ...)", i, p.HostIP))
		}
		a = a.Unmap()
		p.HostIP = a.String()
		opts.Ports[i] = p
		what := fmt.Sprintf("published port %s", p)
		if p.HostPort == 0 {
			what = fmt.Sprintf("published port %s (host_port 0: a free port)", p)
		}
		if len(grants) == 0 {
			return denied("%s: this server grants no published ports (start it with airlock serve --allow-publish %s:LOW-HIGH; add :0 for host_port 0)", what, hostArg(a))
		}
		ok := false
		for _, g := range grants {
			if g.covers(a, p.HostPort, p.Protocol) {
				ok = true
				break
			}
		}
		if !ok {
			gs := make([]string, len(grants))
			for j, g := range grants {
				gs[j] = g.String()
			}
			hint := ""
			if p.HostPort == 0 {
				hint = "; host_port 0 needs a grant whose range starts at 0"
			}
			if !a.IsLoopback() {
				hint += "; a non-loopback address needs a grant naming it (or 0.0.0.0 / ::)"
			}
			return denied("%s is outside what this server grants (%s; airlock serve --allow-publish)%s", what, strings.Join(gs, ", "), hint)
		}
	}
	return nil
}

func hostArg(a netip.Addr) string {
	if a.Is6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}
