package e2b

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/airlock-run/airlock"
)

// allTraffic is E2B's name for every destination (the SDKs' ALL_TRAFFIC):
// a deny_out that lists it makes allow_out the only destinations.
const allTraffic = "0.0.0.0/0"

// maxEgressRules bounds allowOut and denyOut (as REST's allow_net).
const maxEgressRules = 256

// egress is E2B's egress rules, of a create (network) or of an
// update_network (SandboxNetworkUpdateConfig, which adds
// allow_internet_access).
type egress struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	AllowPublicTraffic  *bool           `json:"allowPublicTraffic"`
	Rules               json.RawMessage `json:"rules"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	DNSServers          []string        `json:"dnsServers"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
}

// set reports whether raw holds a value (not absent, not null).
func set(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// netPolicy is E2B's egress rules in airlock's terms (BoxOptions.Network,
// AllowNet, DenyNet).
type netPolicy struct {
	mode        airlock.NetworkMode
	allow, deny []string
}

// policyOf maps E2B's egress rules onto airlock's network policy. E2B lets
// a sandbox reach every destination but those deny_out lists, and those
// allow_out lists always (they take precedence); allow_internet_access
// false is deny_out 0.0.0.0/0. A deny_out that holds 0.0.0.0/0 makes the
// box an allowlist box of allow_out (of nothing when allow_out is empty:
// it reaches nothing, and keeps its network interface, so that get_host
// and a later update_network work). A deny_out of some addresses is a
// public box with those as its DenyNet and allow_out's IPs and CIDRs as
// exceptions to them (a domain in allow_out needs deny_out ALL_TRAFFIC,
// as in E2B, where domain filtering works only when all other traffic is
// denied). allow_out alone makes an allowlist box, which is stricter than
// E2B (where it only makes exceptions to deny_out). Neither: the public
// network. Header rules and an egress proxy are refused (airlock has
// neither); dnsServers is ignored (the box resolves through airlock's
// resolver, which applies the policy).
func policyOf(e egress, noInternet bool) (netPolicy, error) {
	if set(e.Rules) {
		return netPolicy{}, badRequest("network.rules (header transforms) are not supported by airlock's E2B API: give secrets as airlock secrets (docs/secrets.md)")
	}
	if set(e.EgressProxy) {
		return netPolicy{}, badRequest("network.egressProxy is not supported by airlock's E2B API")
	}
	if len(e.AllowOut) > maxEgressRules || len(e.DenyOut) > maxEgressRules {
		return netPolicy{}, badRequest("network: at most %d allowOut and %d denyOut entries", maxEgressRules, maxEgressRules)
	}
	if e.AllowInternetAccess != nil && !*e.AllowInternetAccess {
		noInternet = true
	}
	for _, a := range e.AllowOut {
		if a == "" {
			return netPolicy{}, badRequest("network.allowOut: an empty entry")
		}
	}
	denyAll := noInternet || slices.Contains(e.DenyOut, allTraffic)
	switch {
	case denyAll || len(e.AllowOut) > 0 && len(e.DenyOut) == 0:
		return netPolicy{mode: airlock.NetworkAllowlist, allow: slices.Clone(e.AllowOut)}, nil
	case len(e.DenyOut) == 0:
		return netPolicy{mode: airlock.NetworkPublic}, nil
	}
	for _, d := range e.DenyOut {
		if !isIPRule(d) {
			return netPolicy{}, badRequest("network.denyOut %q: IP addresses and CIDR blocks only, as in E2B", d)
		}
	}
	for _, a := range e.AllowOut {
		if !isIPRule(a) {
			return netPolicy{}, badRequest("network.allowOut %q: a domain needs denyOut [%s] (as in E2B, domain filtering works only when all other traffic is denied); beside a denyOut of some addresses, allowOut lists IP addresses and CIDR blocks", a, allTraffic)
		}
	}
	return netPolicy{mode: airlock.NetworkPublic, allow: slices.Clone(e.AllowOut), deny: slices.Clone(e.DenyOut)}, nil
}

// isIPRule reports whether an egress entry is an IP address or a CIDR
// block, with an optional ":PORT" ("[v6]:PORT" for IPv6), not a name.
func isIPRule(s string) bool {
	h := strings.TrimSpace(s)
	if strings.HasPrefix(h, "[") {
		i := strings.Index(h, "]")
		if i < 0 {
			return false
		}
		h = h[1:i]
	} else if strings.Count(h, ":") == 1 {
		h = h[:strings.LastIndex(h, ":")]
	}
	if _, err := netip.ParsePrefix(h); err == nil {
		return true
	}
	_, err := netip.ParseAddr(h)
	return err == nil
}

// networkInfo is E2B's network of a sandbox's details (get_info): what
// airlock's policy of the box means in E2B's terms, nil for the public
// network.
type networkInfo struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

func networkOf(o airlock.BoxOptions) *networkInfo {
	switch o.Network {
	case airlock.NetworkAllowlist:
		return &networkInfo{AllowOut: o.AllowNet, DenyOut: []string{allTraffic}}
	case airlock.NetworkPublic, "":
		if len(o.DenyNet) > 0 {
			return &networkInfo{AllowOut: o.AllowNet, DenyOut: o.DenyNet}
		}
	case airlock.NetworkNone, airlock.NetworkDisabled:
		return &networkInfo{DenyOut: []string{allTraffic}}
	}
	return nil
}

// updateNetwork (PUT /sandboxes/{id}/network, update_network) replaces
// the sandbox's egress rules (what the body leaves out is cleared, as in
// E2B) with Box.SetNetwork: at once on the running box, whose
// connections to what the new policy denies are closed, and for its
// later resumes. The destinations it opens are checked against the
// server's network grants as a create's.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var body egress
	if err := s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	pol, err := policyOf(body, false)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	ctx := r.Context()
	b, info, err := s.lookup(ctx, r.PathValue("id"))
	if err != nil {
		writeBoxError(w, err)
		return
	}
	if info.Options.Network == airlock.NetworkNone || info.Options.Network == airlock.NetworkDisabled {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s has no network interface (its box was made with network none): its network cannot be changed", info.ID))
		return
	}
	if s.cfg.CheckNetwork != nil {
		if err := s.cfg.CheckNetwork(ctx, pol.allow); err != nil {
			writeBoxError(w, err)
			return
		}
	}
	if err := b.SetNetwork(ctx, airlock.NetworkPolicy{Mode: pol.mode, AllowNet: pol.allow, DenyNet: pol.deny, AllowHostPorts: info.Options.AllowHostPorts}); err != nil {
		writeBoxError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
