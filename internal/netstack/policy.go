// Package netstack is a box's network: a user-mode TCP/IP stack (gVisor's
// netstack) on the host side of the box's virtio-net device, which NATs the
// box's TCP and UDP flows through host sockets when a policy allows them,
// answers DNS itself on the gateway, and forwards published host ports into
// the box. It runs in a helper process per running box (cmd/airlock-net),
// connected to QEMU over a unix stream socket (-netdev stream).
//
// The box sees the same addresses as under QEMU user networking: it is
// GuestAddr/24 with gateway GatewayAddr and resolver DNSAddr.
package netstack

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Modes of a Policy.
const (
	// ModePublic lets the box reach the internet: every destination except
	// the denied ranges (see Denied) and what the policy's Deny lists.
	ModePublic = "public"
	// ModeAllowlist lets the box reach only the destinations its rules
	// list; only listed names resolve.
	ModeAllowlist = "allowlist"
)

// The box's addresses (those of QEMU user networking, which the guest
// kernel's ip= parameter and the guest agent configure).
var (
	GuestAddr   = netip.MustParseAddr("10.0.2.15")
	GatewayAddr = netip.MustParseAddr("10.0.2.2")
	DNSAddr     = netip.MustParseAddr("10.0.2.3")
	BoxSubnet   = netip.MustParsePrefix("10.0.2.0/24")
)

// HostName is the name under which the box reaches the host ports a
// policy's HostPorts open (it resolves to GatewayAddr).
const HostName = "host.airlock.internal"

// Policy is what a box may reach.
type Policy struct {
	// Mode is ModePublic or ModeAllowlist.
	Mode string `json:"mode"`
	// Allow lists the destinations of ModeAllowlist (see ParseRule). In
	// ModePublic with Deny set it lists exceptions to Deny (IPs and CIDRs
	// only, each with an optional port): what they cover is reachable even
	// where Deny covers it, as E2B's allow_out over deny_out.
	Allow []string `json:"allow,omitempty"`
	// Deny lists IPs and CIDRs (each with an optional port) a ModePublic
	// box may not reach, besides the ranges denied in every mode; not
	// names, whose addresses change. Not in ModeAllowlist.
	Deny []string `json:"deny,omitempty"`
	// HostPorts are TCP/UDP ports of the host's 127.0.0.1 the box may reach
	// as HostName:PORT (in either mode).
	HostPorts []int `json:"host_ports,omitempty"`
}

// Rule is one allowlist entry: a name (exact, or "*.example.com" for any
// name below example.com but not example.com itself) or an IP prefix, and
// an optional port (0: any).
type Rule struct {
	Name     string       // lower case, no final dot; "" for an IP rule
	Wildcard bool         // Name is a suffix: any name below it matches
	Prefix   netip.Prefix // valid for an IP rule
	Port     uint16
}

// String returns the rule in the syntax ParseRule reads.
func (r Rule) String() string {
	var s string
	switch {
	case r.Prefix.IsValid() && r.Prefix.IsSingleIP():
		s = r.Prefix.Addr().String()
	case r.Prefix.IsValid():
		s = r.Prefix.String()
	case r.Wildcard:
		s = "*." + r.Name
	default:
		s = r.Name
	}
	if r.Port == 0 {
		return s
	}
	if r.Prefix.IsValid() && r.Prefix.Addr().Is6() {
		s = "[" + s + "]"
	}
	return s + ":" + strconv.Itoa(int(r.Port))
}

// ParseRule parses an allowlist entry: "api.example.com", "*.example.org",
// "203.0.113.7", "203.0.113.0/24", "2001:db8::/32", each optionally with
// ":PORT" ("[2001:db8::1]:443" for an IPv6 address with a port).
func ParseRule(s string) (Rule, error) {
	orig := s
	s = strings.TrimSpace(strings.ToLower(s))
	if s == "" {
		return Rule{}, errors.New("empty allow-net entry")
	}
	host, port := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		i := strings.Index(s, "]")
		if i < 0 {
			return Rule{}, fmt.Errorf("allow-net %q: missing ]", orig)
		}
		host, port = s[1:i], s[i+1:]
		if port != "" {
			if !strings.HasPrefix(port, ":") {
				return Rule{}, fmt.Errorf("allow-net %q: want [ADDRESS]:PORT", orig)
			}
			port = port[1:]
		}
	case strings.Count(s, ":") == 1:
		i := strings.LastIndex(s, ":")
		host, port = s[:i], s[i+1:]
	}
	var r Rule
	if port != "" {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return Rule{}, fmt.Errorf("allow-net %q: port %q out of range (want 1-65535)", orig, port)
		}
		r.Port = uint16(p)
	}
	if strings.Contains(host, "/") {
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return Rule{}, fmt.Errorf("allow-net %q: malformed CIDR: %v", orig, err)
		}
		if p.Addr().Is4In6() {
			return Rule{}, mappedError(orig, p)
		}
		r.Prefix = p.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Is4In6() {
			return Rule{}, mappedError(orig, netip.PrefixFrom(a, a.BitLen()))
		}
		r.Prefix = netip.PrefixFrom(a, a.BitLen())
		return r, nil
	}
	if looksNumeric(host) {
		return Rule{}, fmt.Errorf("allow-net %q: malformed IP address", orig)
	}
	name := strings.TrimSuffix(host, ".")
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		r.Wildcard = true
		name = rest
	}
	if strings.Contains(name, "*") {
		return Rule{}, fmt.Errorf("allow-net %q: a wildcard may only be the whole first label (*.example.com)", orig)
	}
	if err := checkName(name); err != nil {
		return Rule{}, fmt.Errorf("allow-net %q: %v", orig, err)
	}
	if r.Wildcard && !strings.Contains(name, ".") {
		return Rule{}, fmt.Errorf("allow-net %q: a wildcard needs a domain of two labels or more (*.example.com)", orig)
	}
	r.Name = name
	return r, nil
}

// mappedError refuses an IPv4-mapped IPv6 address or prefix
// (::ffff:a.b.c.d): the box reaches such an address as the IPv4 one, so a
// rule must say which IPv4 address it opens, where every check (the
// private and always-denied ranges, a server's grants) sees it as one.
func mappedError(orig string, p netip.Prefix) error {
	want := p.Addr().Unmap().String()
	if !p.IsSingleIP() {
		bits := p.Bits() - 96
		if bits < 0 {
			bits = 0
		}
		want = netip.PrefixFrom(p.Addr().Unmap(), bits).Masked().String()
	}
	return fmt.Errorf("allow-net %q: an IPv4-mapped IPv6 address (::ffff:a.b.c.d) is not accepted: write the IPv4 form, %s", orig, want)
}

func looksNumeric(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// checkName checks a DNS name (lower case, no final dot).
func checkName(name string) error {
	if name == "" || len(name) > 253 {
		return errors.New("a name must be 1-253 characters")
	}
	for _, l := range strings.Split(name, ".") {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("bad label %q in name (labels are 1-63 characters)", l)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("bad character %q in name", c)
			}
		}
	}
	return nil
}

// matchName reports whether name (lower case, no final dot) matches r.
func (r Rule) matchName(name string) bool {
	if r.Name == "" {
		return false
	}
	if r.Wildcard {
		return strings.HasSuffix(name, "."+r.Name)
	}
	return name == r.Name
}

func (r Rule) portOK(port uint16) bool { return r.Port == 0 || r.Port == port }

// compiled is a checked Policy.
type compiled struct {
	Policy
	rules     []Rule
	deny      []Rule
	hostPorts map[uint16]bool
}

// Validate checks p and returns the first problem, in words meant for the
// user (bad mode, malformed rule, host port out of range, rules in public
// mode).
func (p Policy) Validate() error {
	_, err := compile(p)
	return err
}

func compile(p Policy) (*compiled, error) {
	c := &compiled{Policy: p, hostPorts: map[uint16]bool{}}
	switch p.Mode {
	case ModePublic:
		if len(p.Allow) > 0 && len(p.Deny) == 0 {
			return nil, fmt.Errorf("allow-net entries need network mode %q, not %q", ModeAllowlist, p.Mode)
		}
	case ModeAllowlist:
		if len(p.Deny) > 0 {
			return nil, fmt.Errorf("deny-net entries need network mode %q, not %q (an allowlist box reaches only what it lists)", ModePublic, p.Mode)
		}
	default:
		return nil, fmt.Errorf("network mode %q: want %q or %q", p.Mode, ModePublic, ModeAllowlist)
	}
	for _, s := range p.Allow {
		r, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		if p.Mode == ModePublic && !r.Prefix.IsValid() {
			return nil, fmt.Errorf("allow-net %q: in network mode %q the entries are exceptions to deny-net: IPs and CIDRs only, not names", s, ModePublic)
		}
		if r.Prefix.IsValid() {
			if why := neverAllowed(r.Prefix); why != "" {
				return nil, fmt.Errorf("allow-net %q: %s is never reachable from a box (for a service on the host's loopback use --allow-host-port)", s, why)
			}
		}
		c.rules = append(c.rules, r)
	}
	for _, s := range p.Deny {
		r, err := ParseRule(s)
		if err != nil {
			return nil, fmt.Errorf("deny-net: %w", err)
		}
		if !r.Prefix.IsValid() {
			return nil, fmt.Errorf("deny-net %q: IPs and CIDRs only, not names (a name's addresses change)", s)
		}
		c.deny = append(c.deny, r)
	}
	for _, hp := range p.HostPorts {
		if hp < 1 || hp > 65535 {
			return nil, fmt.Errorf("allow-host-port %d out of range (want 1-65535)", hp)
		}
		c.hostPorts[uint16(hp)] = true
	}
	return c, nil
}

// nameAllowed reports whether the box may resolve name.
func (c *compiled) nameAllowed(name string) bool {
	if c.Mode == ModePublic || name == HostName {
		return true
	}
	return slices.ContainsFunc(c.rules, func(r Rule) bool { return r.matchName(name) })
}

// listed reports whether an IP rule covers addr:port.
func (c *compiled) listed(addr netip.Addr, port uint16) bool {
	for _, r := range c.rules {
		if r.Prefix.IsValid() && r.Prefix.Contains(addr) && r.portOK(port) {
			return true
		}
	}
	return false
}

// denied reports whether a Deny rule covers addr:port.
func (c *compiled) denied(addr netip.Addr, port uint16) bool {
	for _, r := range c.deny {
		if r.Prefix.Contains(addr) && r.portOK(port) {
			return true
		}
	}
	return false
}

// listedPrivate reports whether an IP rule within the private range priv
// covers addr (on port, unless port is 0: any): a private address is
// opened only by a rule that names that private range or part of it, not
// by a wider one such as 0.0.0.0/0:443.
func (c *compiled) listedPrivate(priv netip.Prefix, addr netip.Addr, port uint16, anyPort bool) bool {
	for _, r := range c.rules {
		if r.Prefix.IsValid() && r.Prefix.Bits() >= priv.Bits() && priv.Contains(r.Prefix.Addr()) &&
			r.Prefix.Contains(addr) && (anyPort || r.portOK(port)) {
			return true
		}
	}
	return false
}

// nameAllowsPort reports whether a name rule matching name allows port.
func (c *compiled) nameAllowsPort(name string, port uint16) bool {
	for _, r := range c.rules {
		if r.matchName(name) && r.portOK(port) {
			return true
		}
	}
	return false
}

// neverAllowed says why no rule may open p ("" when some can): p lies
// within a range denied in every mode, or the box's own network.
func neverAllowed(p netip.Prefix) string {
	within := func(d netip.Prefix) bool { return d.Contains(p.Addr()) && p.Bits() >= d.Bits() }
	if within(BoxSubnet) {
		return "the box's own network"
	}
	for _, d := range alwaysDenied {
		if within(d.p) {
			return d.reason
		}
	}
	return ""
}
