package netstack

import (
	"fmt"
	"net"
	"strconv"
)

// The modes a box's options name besides ModePublic and ModeAllowlist.
const (
	// ModeNone: no network device.
	ModeNone = "none"
	// ModeEnabled and ModeDisabled are the former names of ModePublic and
	// ModeNone, still accepted.
	ModeEnabled  = "enabled"
	ModeDisabled = "disabled"
)

// CanonicalMode returns the mode a box's stored or given mode means: ""
// is ModeAllowlist when allow is set, else ModePublic; the former names
// are today's; any other mode is returned as it is (CheckOptions refuses
// an unknown one).
func CanonicalMode(mode string, allow []string) string {
	switch mode {
	case "":
		if len(allow) > 0 {
			return ModeAllowlist
		}
		return ModePublic
	case ModeEnabled:
		return ModePublic
	case ModeDisabled:
		return ModeNone
	}
	return mode
}

// BoxPolicy is the Policy of a box of canonical mode with allow, deny
// and hostPorts. ModeNone is an allowlist of nothing: a running box
// switched to none keeps its NIC, reaching nothing.
func BoxPolicy(mode string, allow, deny []string, hostPorts []int) Policy {
	if mode == ModeNone {
		return Policy{Mode: ModeAllowlist}
	}
	return Policy{Mode: mode, Allow: allow, Deny: deny, HostPorts: hostPorts}
}

// CheckOptions checks a box's network options: its canonical mode, the
// destinations it allows and denies, the host ports it may reach, and the ports it
// publishes, whose defaults (protocol tcp, host address 127.0.0.1) are
// filled in in place. A box without a network (ModeNone) may have none
// of the others; a published host address, port and protocol given
// twice is refused.
func CheckOptions(mode string, allow, deny []string, hostPorts []int, publish []Publish) error {
	switch mode {
	case ModeNone:
		if len(allow) > 0 {
			return fmt.Errorf("allow-net entries need network mode %q, not %q", ModeAllowlist, ModeNone)
		}
		if len(deny) > 0 {
			return fmt.Errorf("deny-net entries need network mode %q, not %q", ModePublic, ModeNone)
		}
		if len(hostPorts) > 0 {
			return fmt.Errorf("allow-host-port needs a network: not with network mode %q", ModeNone)
		}
		if len(publish) > 0 {
			return fmt.Errorf("published ports (-p) need a network: not with network mode %q", ModeNone)
		}
		return nil
	case ModePublic, ModeAllowlist:
	default:
		return fmt.Errorf("network %q: want %q (default), %q or %q", mode, ModePublic, ModeAllowlist, ModeNone)
	}
	if err := BoxPolicy(mode, allow, deny, hostPorts).Validate(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, p := range publish {
		if p.Proto == "" {
			p.Proto = "tcp"
		}
		if p.HostIP == "" {
			p.HostIP = "127.0.0.1"
		}
		// As the -p syntax (ParsePublish) reads it: its bounds.
		if _, err := ParsePublish(net.JoinHostPort(p.HostIP, strconv.Itoa(p.HostPort)) + ":" + strconv.Itoa(p.GuestPort) + "/" + p.Proto); err != nil {
			return err
		}
		publish[i] = p
		if k := p.HostIP + ":" + strconv.Itoa(p.HostPort) + "/" + p.Proto; p.HostPort != 0 && seen[k] {
			return fmt.Errorf("published port %s given twice", k)
		} else {
			seen[k] = true
		}
	}
	return nil
}
