package server

import (
	"context"
	"net/netip"

	"github.com/airlock-run/airlock"
)

// pullContext returns ctx under which the image pulls a request causes
// (POST /v1/images/pull, a create whose image is absent) obey the server's
// network grants (see checkPullAddr).
func (s *Server) pullContext(ctx context.Context) context.Context {
	p, _ := s.policyFor(ctx)
	return airlock.WithPullCheck(ctx, p.checkPullAddr)
}

// checkPullAddr applies the network grants to an address an image pull
// connects to (the registry, a redirect, the token realm), after name
// resolution: the server's loopback and the private ranges need
// --allow-private-net, as they do in allow_net; link-local (cloud
// metadata), multicast and unspecified addresses are refused always. A
// refusal is 403 policy_denied.
func (p Policy) checkPullAddr(host string, a netip.Addr) error {
	a = a.Unmap()
	at := host
	if host != a.String() {
		at = host + " (" + a.String() + ")"
	}
	if a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsMulticast() || a.IsUnspecified() || a.IsInterfaceLocalMulticast() {
		return denied("image pull: connecting to %s, a link-local, multicast or unspecified address, which no pull may reach", at)
	}
	if p.AllowPrivateNet {
		return nil
	}
	if a.IsLoopback() {
		return denied("image pull: connecting to %s, on the server's loopback, which this server does not grant (airlock serve --allow-private-net)", at)
	}
	for _, priv := range privateNets {
		if priv.Contains(a) {
			return denied("image pull: connecting to %s, in the private range %s, which this server does not grant (airlock serve --allow-private-net)", at, priv)
		}
	}
	return nil
}
