package netstack

import (
	"net"
	"net/netip"
	"strings"

	"github.com/airlock-run/airlock/internal/defaults"
)

// Ranges no box reaches in any mode: the host's loopback and (see
// hostAddrs) its own addresses, link-local (cloud metadata at
// 169.254.169.254), multicast, broadcast and "this network".
var alwaysDenied = []struct {
	p      netip.Prefix
	reason string
}{
	{netip.MustParsePrefix("127.0.0.0/8"), "host loopback"},
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (metadata)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved/broadcast"},
	{netip.MustParsePrefix("::1/128"), "host loopback"},
	{netip.MustParsePrefix("::/128"), "unspecified address"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// Private ranges: denied in public mode; in allowlist mode reachable only
// through an IP rule that lists them.
var privateRanges = []struct {
	p      netip.Prefix
	reason string
}{
	{netip.MustParsePrefix("10.0.0.0/8"), "private range (RFC 1918)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private range (RFC 1918)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private range (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGNAT)"},
	{netip.MustParsePrefix("fc00::/7"), "unique local address (ULA)"},
}

// TestInternetEnv names a test-only environment variable: an IPv4 /24
// (e.g. 198.18.0.0/24) whose addresses the helper treats as internet
// servers but reaches at the same last octet on 127.0.0.0/24 (198.18.0.2
// at 127.0.0.2). Tests stand in for the internet with servers on loopback
// this way, so that no packet leaves the host; never set it for real boxes.
const TestInternetEnv = defaults.NetTestInternetEnv

// testInternet reads TestInternetEnv.
func testInternet() netip.Prefix {
	p, err := netip.ParsePrefix(strings.TrimSpace(defaults.NetTestInternet()))
	if err != nil || !p.Addr().Is4() || p.Bits() != 24 {
		return netip.Prefix{}
	}
	return p.Masked()
}

// dialAddr is where the helper connects for an allowed destination a.
func (e *Engine) dialAddr(a netip.Addr) netip.Addr {
	if e.testInternet.IsValid() && e.testInternet.Contains(a) {
		return netip.AddrFrom4([4]byte{127, 0, 0, a.As4()[3]})
	}
	return a
}

// hostAddrs returns the host's own interface addresses.
func hostAddrs() map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return m
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				m[ip.Unmap()] = true
			}
		}
	}
	return m
}

// privateRange returns the private range addr is in, if any.
func privateRange(addr netip.Addr) netip.Prefix {
	for _, d := range privateRanges {
		if d.p.Contains(addr.Unmap()) {
			return d.p
		}
	}
	return netip.Prefix{}
}

// classify returns why addr is denied in every mode ("" if it is not) and
// whether it is in a private range.
func (e *Engine) classify(addr netip.Addr) (always string, private string) {
	addr = addr.Unmap()
	if BoxSubnet.Contains(addr) {
		return "box network", ""
	}
	for _, d := range alwaysDenied {
		if d.p.Contains(addr) {
			return d.reason, ""
		}
	}
	if e.hostAddrs[addr] {
		return "host address", ""
	}
	for _, d := range privateRanges {
		if d.p.Contains(addr) {
			return "", d.reason
		}
	}
	return "", ""
}
