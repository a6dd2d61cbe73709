package airlock

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/boxrecord"
	"github.com/airlock-run/airlock/internal/lifecycle"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/netstack/helper"
	"github.com/airlock-run/airlock/internal/secrets"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// NetworkMode is what a box's network reaches (BoxOptions.Network,
// NetworkPolicy.Mode).
type NetworkMode string

// Network modes for BoxOptions.Network.
const (
	// NetworkPublic (the default) lets the box reach the internet through
	// airlock's own user-mode network stack, which runs on the host in a
	// helper process per running box (airlock-net). Always denied: the
	// host's loopback and its own addresses, private ranges (RFC 1918,
	// CGNAT 100.64/10, IPv6 ULA), link-local addresses (169.254/16, cloud
	// metadata), multicast and broadcast, and the box's gateway except for
	// DNS and the ports AllowHostPorts opens. Names that resolve to those
	// ranges are refused (DNS rebinding). The box has no IPv6 and cannot
	// be reached from outside except through Ports.
	NetworkPublic NetworkMode = "public"
	// NetworkAllowlist lets the box reach only what AllowNet lists: only
	// listed names resolve (others get NXDOMAIN, and the query never leaves
	// the host), connections go only to addresses a listed name resolved
	// to or to listed IPs/CIDRs, and DNS to any other server is refused.
	NetworkAllowlist NetworkMode = "allowlist"
	// NetworkNone gives the box no network interface at all.
	NetworkNone NetworkMode = "none"

	// NetworkEnabled is the former name of NetworkPublic, still accepted.
	//
	// Deprecated: use NetworkPublic.
	NetworkEnabled NetworkMode = "enabled"
	// NetworkDisabled is the former name of NetworkNone, still accepted.
	//
	// Deprecated: use NetworkNone.
	NetworkDisabled NetworkMode = "disabled"
)

// HostName is the name under which a box reaches the host ports that
// BoxOptions.AllowHostPorts opens (host.airlock.internal).
const HostName = netstack.HostName

// PortMapping is a published port: connections to HostIP:HostPort on the
// host reach the box's GuestPort.
type PortMapping struct {
	// HostIP is the host address to listen on (default 127.0.0.1).
	HostIP string `json:"host_ip,omitempty"`
	// HostPort is the host port; 0 picks a free one at each start (see
	// Box.Ports for the one bound).
	HostPort int `json:"host_port"`
	// GuestPort is the port in the box (1-65535).
	GuestPort int `json:"guest_port"`
	// Protocol is "tcp" (default) or "udp".
	Protocol string `json:"protocol,omitempty"`
}

// String returns the mapping in the syntax ParsePortMapping reads.
func (p PortMapping) String() string {
	proto := p.Protocol
	if proto == "" {
		proto = "tcp"
	}
	ip := p.HostIP
	if ip == "" {
		ip = "127.0.0.1"
	}
	return net.JoinHostPort(ip, strconv.Itoa(p.HostPort)) + ":" + strconv.Itoa(p.GuestPort) + "/" + proto
}

// ParsePortMapping parses a published port in Docker's -p syntax:
// [HOSTIP:]HOSTPORT:GUESTPORT[/tcp|/udp].
func ParsePortMapping(s string) (PortMapping, error) {
	p, err := netstack.ParsePublish(s)
	if err != nil {
		return PortMapping{}, err
	}
	return portOf(p), nil
}

// NetworkPolicy is what a box may reach; see Box.SetNetwork.
type NetworkPolicy struct {
	// Mode is NetworkPublic, NetworkAllowlist or NetworkNone; "" means
	// NetworkPublic when DenyNet is set, else NetworkAllowlist when
	// AllowNet is set, else NetworkPublic.
	Mode NetworkMode
	// AllowNet lists the destinations of NetworkAllowlist: names
	// ("api.example.com"; "*.example.com" for any name below example.com),
	// IPs and CIDRs ("203.0.113.7", "203.0.113.0/24"), each with an
	// optional ":PORT". A listed IP or CIDR within a private range (RFC
	// 1918, CGNAT, ULA) opens that part of it; the host's loopback,
	// link-local addresses and the box's own network cannot be listed.
	// With DenyNet (NetworkPublic), AllowNet lists exceptions to it: IPs
	// and CIDRs it covers that stay reachable (E2B's allow_out over
	// deny_out); they open no private range.
	AllowNet []string
	// DenyNet lists IPs and CIDRs ("198.51.100.0/24", "203.0.113.7:22")
	// a NetworkPublic box may not reach, besides the ranges public mode
	// always denies: a denylist. Not names (their addresses change), and
	// not with NetworkAllowlist or NetworkNone.
	DenyNet []string
	// AllowHostPorts are ports of the host's 127.0.0.1 the box may reach,
	// as HostName:PORT (in public and allowlist mode).
	AllowHostPorts []int
}

// netMode returns the canonical mode of a stored or given mode
// (netstack.CanonicalMode).
func netMode(mode NetworkMode, allow []string) NetworkMode {
	return NetworkMode(netstack.CanonicalMode(string(mode), allow))
}

// publishes are ports as the network helper publishes them; portOf is
// one of them as a PortMapping (boxopts.Publishes, boxopts.Port).
func publishes(ports []PortMapping) []netstack.Publish {
	return boxopts.Publishes(convert(ports, func(p PortMapping) boxrecord.Port { return boxrecord.Port(p) }))
}

func portOf(p netstack.Publish) PortMapping { return PortMapping(boxopts.Port(p)) }

// hasNetwork reports whether a box of configuration cfg gets a NIC.
func hasNetwork(cfg boxConfig) bool {
	o := cfg.Options
	return netMode(o.Network, o.AllowNet) != NetworkNone
}

// netBox is the box as its network helper's supervisor knows it.
func (b *Box) netBox() helper.Box { return helper.Box{ID: b.id, Dir: b.dir} }

// netSpec is the NIC of a box of configuration cfg (nil: none): a socket
// its machine listens on and its network helper connects to.
func (b *Box) netSpec(cfg boxConfig) *vmm.NetSpec {
	if !hasNetwork(cfg) {
		return nil
	}
	if benchSlirp() {
		return &vmm.NetSpec{}
	}
	return &vmm.NetSpec{Socket: b.netBox().NetSocket(), MTU: netstack.MTU}
}

// startNet launches the box's network helper (when it has a network; nil
// otherwise), before its machine: the helper binds the published ports
// and then connects to the machine's network socket once the machine has
// made it, while the machine starts. Its Wait waits for it.
func (b *Box) startNet(cfg boxConfig) (*helper.Starting, error) {
	if !hasNetwork(cfg) || benchSlirp() {
		return b.eng.StartNet(nil)
	}
	o := cfg.Options
	ho := helper.Options{Bin: b.r.opts.NetHelper, Upstream: b.r.opts.DNSUpstream,
		Unconfined: b.r.opts.Unconfined, UIDRange: b.r.opts.UIDRange, Warn: b.r.warn}
	sc, err := secrets.HelperConfig(b.dir, cfg.Options.Secrets, cfg.Placeholders)
	if err != nil {
		return nil, fmt.Errorf("box %s: secrets: %w", b.id, err)
	}
	ho.Secrets = sc
	ports := o.Ports
	b.mu.Lock()
	if len(b.rebind) == len(ports) { // a rollback keeps the ports picked
		ports = b.rebind
	}
	b.rebind = nil
	b.mu.Unlock()
	return b.eng.StartNet(&lifecycle.Net{Options: ho, Hold: o.IdleAction == IdleSuspend, Publish: publishes(ports),
		Policy: boxopts.Policy(o.plain(), o.plain())})
}

// Ports returns the box's published ports as bound by its current start
// (a HostPort of 0 replaced by the port picked); nil when it publishes
// none or is not running.
func (b *Box) Ports(ctx context.Context) ([]PortMapping, error) {
	if err := b.wake(ctx); err != nil {
		return nil, err
	}
	info, err := b.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.State != store.StateRunning {
		return nil, nil
	}
	return readPorts(b.dir), nil
}

// readPorts returns the published ports of the box in dir as its network
// helper bound them.
func readPorts(dir string) []PortMapping {
	var ports []PortMapping
	for _, p := range helper.Ports(dir) {
		ports = append(ports, portOf(p))
	}
	return ports
}

// NetworkLog returns the path of the box's log of denied network attempts
// (one line each: time, protocol, destination, reason; kept under 1 MiB,
// the previous generation in NetworkLog()+".1").
func (b *Box) NetworkLog() string { return filepath.Join(b.dir, boxdir.NetLog) }

// NetworkStats are a box's network counters since its last start.
type NetworkStats struct {
	// BytesOut and BytesIn are TCP and UDP payload bytes the box sent and
	// received (through NAT and published ports).
	BytesOut, BytesIn uint64
	// Denied counts refused connections, UDP flows, pings and DNS queries.
	Denied uint64
	// Connections counts TCP connections and UDP flows opened.
	Connections uint64
	// DNSQueries counts queries the box's resolver answered.
	DNSQueries uint64
}

// NetworkStats returns the counters of a running box's network. It
// returns ErrBoxNotRunning for a stopped box and an error for a box with
// network mode none.
func (b *Box) NetworkStats(ctx context.Context) (NetworkStats, error) {
	resp, err := b.netCall(ctx, netstack.Request{Op: "stats"})
	if err != nil {
		return NetworkStats{}, err
	}
	s := resp.Stats
	return NetworkStats{BytesOut: s.BytesOut, BytesIn: s.BytesIn, Denied: s.Denied, Connections: s.Connections, DNSQueries: s.DNSQueries}, nil
}

// DialPort opens a TCP connection to port inside the running box, through
// its network as a published port's connections go (no port need be
// published): for port forwarding (`kubectl port-forward`). The network
// policy does not apply (it governs what the box reaches). ctx bounds the
// setup (10 s without a deadline). It returns ErrBoxNotRunning for a
// stopped box, and an error for a box with network mode none or when
// nothing listens on port in the box.
func (b *Box) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: port %d: want 1-65535", ErrInvalidArgument, port)
	}
	if err := b.wake(ctx); err != nil {
		return nil, err
	}
	if err := b.netReady(ctx); err != nil {
		return nil, err
	}
	return helper.Connect(ctx, b.netBox(), port)
}

// netReady returns nil when the box runs with a network helper.
func (b *Box) netReady(ctx context.Context) error {
	info, err := b.Info(ctx)
	if err != nil {
		return err
	}
	if info.State != store.StateRunning {
		return fmt.Errorf("%w: %s", ErrBoxNotRunning, b.id)
	}
	if _, cfg := b.snapshot(); !hasNetwork(cfg) {
		return fmt.Errorf("box %s has no network (mode %s)", b.id, NetworkNone)
	}
	return nil
}

// netCall makes a control call to the network helper of the running box.
func (b *Box) netCall(ctx context.Context, req netstack.Request) (netstack.Response, error) {
	if err := b.netReady(ctx); err != nil {
		return netstack.Response{}, err
	}
	return helper.Call(ctx, b.netBox(), req)
}

// SetNetwork changes the box's network policy, in its record (for later
// starts) and, when it runs, at once: connections it has open to
// destinations the new policy denies are closed. A box created with
// NetworkNone has no network device: it gets one only at its next start.
// Switching a running box to NetworkNone denies everything until it is
// restarted without a device.
func (b *Box) SetNetwork(ctx context.Context, p NetworkPolicy) error {
	p.Mode = NetworkMode(boxopts.Mode(boxopts.DenyMode(string(p.Mode), p.DenyNet), p.AllowNet))
	o := BoxOptions{Network: p.Mode, AllowNet: p.AllowNet, DenyNet: p.DenyNet, AllowHostPorts: p.AllowHostPorts}
	rec, unlock, err := b.lockLoad(ctx)
	defer unlock()
	if err != nil {
		return err
	}
	_, cur := b.snapshot()
	o.Ports = cur.Options.Ports
	if err := checkNetwork(&o); err != nil {
		return err
	}
	if err := b.eng.SetPolicy(ctx, rec, boxopts.Policy(o.plain(), cur.Options.plain()), o.Network == NetworkNone); err != nil {
		return err
	}
	// Only the network fields: a use or lease renewal since cur was read
	// must stay.
	if err := b.r.updateConfig(ctx, b.id, func(c *boxConfig) {
		c.Options.Network, c.Options.AllowNet, c.Options.DenyNet, c.Options.AllowHostPorts = o.Network, o.AllowNet, o.DenyNet, o.AllowHostPorts
	}); err != nil {
		return fmt.Errorf("box %s: record its network: %w", b.id, err)
	}
	_, err = b.load(ctx)
	return err
}
