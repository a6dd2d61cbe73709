package e2b

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

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

// policyOf maps E2B's egress rules onto airlock's network policy. E2B lets
// a sandbox reach every destination but those deny_out lists, and those
// allow_out lists always (they take precedence); allow_internet_access
// false is deny_out 0.0.0.0/0. airlock's policy allows, it does not deny:
// a deny_out must deny all traffic (0.0.0.0/0; other entries beside it
// change nothing), and the box is then an allowlist box of allow_out (of
// nothing when allow_out is empty: it reaches nothing, and keeps its
// network interface, so that get_host and a later update_network work).
// allow_out alone makes an allowlist box too, which is stricter than E2B
// (where it only makes exceptions to deny_out). Neither: the public
// network. Header rules and an egress proxy are refused (airlock has
// neither); dnsServers is ignored (the box resolves through airlock's
// resolver, which applies the policy).
func policyOf(e egress, noInternet bool) (airlock.NetworkMode, []string, error) {
	if set(e.Rules) {
		return "", nil, badRequest("network.rules (header transforms) are not supported by airlock's E2B API: give secrets as airlock secrets (docs/secrets.md)")
	}
	if set(e.EgressProxy) {
		return "", nil, badRequest("network.egressProxy is not supported by airlock's E2B API")
	}
	if len(e.AllowOut) > maxEgressRules || len(e.DenyOut) > maxEgressRules {
		return "", nil, badRequest("network: at most %d allowOut and %d denyOut entries", maxEgressRules, maxEgressRules)
	}
	if e.AllowInternetAccess != nil && !*e.AllowInternetAccess {
		noInternet = true
	}
	denyAll := noInternet || slices.Contains(e.DenyOut, allTraffic)
	if !denyAll && len(e.DenyOut) > 0 {
		return "", nil, badRequest("network.denyOut %q: airlock denies all traffic or nothing: deny %s and list what the sandbox may reach in allowOut (the public network already denies private, link-local and loopback ranges)", e.DenyOut, allTraffic)
	}
	for _, a := range e.AllowOut {
		if a == "" {
			return "", nil, badRequest("network.allowOut: an empty entry")
		}
	}
	if !denyAll && len(e.AllowOut) == 0 {
		return airlock.NetworkPublic, nil, nil
	}
	return airlock.NetworkAllowlist, slices.Clone(e.AllowOut), nil
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
	mode, allow, err := policyOf(body, false)
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
		if err := s.cfg.CheckNetwork(ctx, allow); err != nil {
			writeBoxError(w, err)
			return
		}
	}
	if err := b.SetNetwork(ctx, airlock.NetworkPolicy{Mode: mode, AllowNet: allow, AllowHostPorts: info.Options.AllowHostPorts}); err != nil {
		writeBoxError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
