package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock-run/airlock"
)

// Policy is what the operator grants API clients (airlock serve flags).
// Zero caps (MaxBoxes, MaxCPUs, MaxMemoryMiB) mean no limit beyond the
// library's own; empty grants (AllowVolumeDirs, AllowHostPorts, AllowPublish) grant
// nothing. A request past a cap or outside the grants gets 403
// policy_denied with the reason. It applies to every listener.
type Policy struct {
	// MaxBoxes bounds the boxes of the home that are not stopped
	// (created or running).
	MaxBoxes int
	// MaxSnapshots bounds the memory snapshots of the home (POST
	// /v1/boxes/{id}/snapshot; a fork's own, removed at once, does not
	// count). 0: no limit.
	MaxSnapshots int
	// MaxCPUs and MaxMemoryMiB bound one box's vCPUs and RAM.
	MaxCPUs      int
	MaxMemoryMiB int

	// AllowVolumeDirs are the host directories under which a create
	// request may attach host directory volumes (airlock serve
	// --allow-volume). A volume's source is resolved (symlinks followed)
	// before the check, and the box gets the resolved path. Empty: no host
	// volumes at all.
	AllowVolumeDirs []string
	// DenyNamedVolumes refuses named volumes (airlock serve
	// --allow-named-volumes=false); by default a client may create and
	// attach them (they live in the airlock home, each bounded by its size).
	DenyNamedVolumes bool
	// AllowHostPorts are the host ports a box's network may open with
	// allow_host_ports (airlock serve --allow-host-port). Empty: none.
	AllowHostPorts []int
	// AllowPrivateNet lets allow_net list IPs and CIDRs inside private
	// ranges (RFC 1918, CGNAT 100.64/10, IPv6 ULA), which open those parts
	// of the host's networks to the box (airlock serve --allow-private-net).
	// Names and public addresses need no grant: they reach no more than
	// the default public network does. It also lets the image pulls
	// clients cause connect to the server's loopback and private ranges
	// (registries, redirects, token realms; checked on the resolved
	// address), which they may not otherwise.
	AllowPrivateNet bool
	// AllowPublish are the host addresses and port ranges a create
	// request's ports may publish on (airlock serve --allow-publish; see
	// PublishGrant). Empty: no published ports at all.
	AllowPublish []PublishGrant
}

// privateNets are the ranges whose listing in allow_net needs
// Policy.AllowPrivateNet (the ones airlock's public network denies but an
// allowlist entry can open).
var privateNets = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fc00::/7"),
}

// allowNetPrefix returns the IP range an allow_net entry names, if it
// names one (a name returns false). An IPv4-mapped IPv6 range
// (::ffff:10.0.0.5) is returned as the IPv4 one, which is what a box
// reaches through it.
func allowNetPrefix(entry string) (netip.Prefix, bool) {
	unmap := func(p netip.Prefix) netip.Prefix {
		if !p.Addr().Is4In6() {
			return p.Masked()
		}
		return netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0)).Masked()
	}
	try := func(s string) (netip.Prefix, bool) {
		s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
		if p, err := netip.ParsePrefix(s); err == nil {
			return unmap(p), true
		}
		if a, err := netip.ParseAddr(s); err == nil {
			return unmap(netip.PrefixFrom(a, a.BitLen())), true
		}
		return netip.Prefix{}, false
	}
	if p, ok := try(entry); ok {
		return p, true
	}
	if i := strings.LastIndex(entry, ":"); i > 0 {
		return try(entry[:i])
	}
	return netip.Prefix{}, false
}

// ResolveVolumeDirs resolves directories granted with --allow-volume
// (absolute, symlinks followed), so that checks compare real paths. A
// directory that does not exist is an error.
func ResolveVolumeDirs(dirs []string) ([]string, error) {
	out := make([]string, 0, len(dirs))
	for _, d := range dirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, err
		}
		real, err := filepath.EvalSymlinks(abs)
		if err != nil {
			return nil, fmt.Errorf("--allow-volume %s: %w", d, err)
		}
		if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("--allow-volume %s: not a directory", d)
		}
		out = append(out, real)
	}
	return out, nil
}

func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

// checkGrants applies the volume and network grants to a create request;
// host volume sources in opts are replaced by their resolved paths.
func (s *Server) checkGrants(opts *airlock.BoxOptions) error {
	p := s.cfg.Policy
	for i, v := range opts.Volumes {
		if !v.IsHostDir() {
			if p.DenyNamedVolumes {
				return denied("named volume %q: this server refuses named volumes (airlock serve --allow-named-volumes=false)", v.Source)
			}
			continue
		}
		if len(s.volumeDirs) == 0 {
			return denied("host volume %s: this server grants no host directories (start it with airlock serve --allow-volume DIR)", v.Source)
		}
		real, err := filepath.EvalSymlinks(filepath.Clean(v.Source))
		if err != nil {
			return denied("host volume %s: cannot resolve it on the server's host (%v): give an existing directory under %s",
				v.Source, errors.Unwrap(err), strings.Join(s.volumeDirs, ", "))
		}
		ok := false
		for _, d := range s.volumeDirs {
			if within(d, real) {
				ok = true
				break
			}
		}
		if !ok {
			detail := ""
			if real != filepath.Clean(v.Source) {
				detail = " (" + real + " once symlinks are resolved)"
			}
			return denied("host volume %s%s is not under a directory this server grants (%s; airlock serve --allow-volume)",
				v.Source, detail, strings.Join(s.volumeDirs, ", "))
		}
		opts.Volumes[i].Source = real
	}
	if err := s.checkPorts(opts); err != nil {
		return err
	}
	for _, port := range opts.AllowHostPorts {
		if !slices.Contains(p.AllowHostPorts, port) {
			return denied("allow_host_ports %d: this server grants host ports %v (airlock serve --allow-host-port)", port, p.AllowHostPorts)
		}
	}
	if !p.AllowPrivateNet {
		for _, e := range opts.AllowNet {
			pre, ok := allowNetPrefix(e)
			if !ok {
				continue
			}
			for _, priv := range privateNets {
				if pre.Bits() >= priv.Bits() && priv.Contains(pre.Addr()) {
					return denied("allow_net %q: opens part of the private range %s, which this server does not grant (airlock serve --allow-private-net)", e, priv)
				}
			}
		}
	}
	return nil
}

func denied(format string, a ...any) *Problem {
	return &Problem{Status: http.StatusForbidden, Title: "Forbidden", Code: CodePolicyDenied, Detail: fmt.Sprintf(format, a...)}
}

// checkCreate applies the policy to a create request.
func (s *Server) checkCreate(ctx context.Context, opts *airlock.BoxOptions) error {
	p := s.cfg.Policy
	if err := s.checkGrants(opts); err != nil {
		return err
	}
	cpus, mem := opts.CPUs, opts.MemoryMiB
	if cpus == 0 {
		cpus = airlock.DefaultCPUs
	}
	if mem == 0 {
		mem = airlock.DefaultMemoryMiB
	}
	if p.MaxCPUs > 0 && cpus > p.MaxCPUs {
		return denied("%d vCPUs asked; this server allows at most %d per box (airlock serve --max-cpus)", cpus, p.MaxCPUs)
	}
	if p.MaxMemoryMiB > 0 && mem > p.MaxMemoryMiB {
		return denied("%d MiB of memory asked; this server allows at most %d MiB per box (airlock serve --max-memory)", mem, p.MaxMemoryMiB)
	}
	return s.checkBoxRoom(ctx, 1, "")
}

// checkBoxRoom refuses making n more boxes when they would pass
// Policy.MaxBoxes (boxes not stopped), saying so with msg (formatted with
// n, the boxes up and the limit), or a create's message when msg is "".
func (s *Server) checkBoxRoom(ctx context.Context, n int, msg string) error {
	max := s.cfg.Policy.MaxBoxes
	if max <= 0 {
		return nil
	}
	infos, err := s.rt.List(ctx)
	if err != nil {
		return problem(err)
	}
	up := 0
	for _, i := range infos {
		if i.State != "stopped" {
			up++
		}
	}
	if up+n <= max {
		return nil
	}
	if msg == "" {
		return denied("%d boxes are not stopped; this server allows at most %d (airlock serve --max-boxes): remove one first", up, max)
	}
	return denied(msg, n, up, max)
}
