// Package boxopts is what the root package's BoxOptions mean, apart from
// the public type: the defaults filled in and the checks (Defaults), the
// options of a box restored from a snapshot (Restore), of an imported
// one (Archived) and of a warm pool's boxes (PoolKey), and their stored
// form (Encode, Decode: internal/boxrecord). It takes Options, a plain
// copy of BoxOptions (the same fields, with the public named types as
// their underlying ones), which the root package converts to and from;
// so it is tested with no Runtime.
package boxopts

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlock-run/airlock/internal/boxrecord"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/lifetime"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/secrets"
	"github.com/airlock-run/airlock/internal/volume"
)

// ErrInvalid is the root package's ErrInvalidArgument: every refusal
// here wraps it.
var ErrInvalid = errors.New("invalid argument")

// Defaults and bounds of Options (the root package's DefaultImage,
// DefaultCPUs, ..., MaxCPUs, MinMemoryMiB, MinDiskSizeMiB name the same
// values; TestBoxOptionConstants checks).
const (
	DefaultImage       = "python:slim"
	DefaultCPUs        = 1
	DefaultMemoryMiB   = 512
	DefaultDiskSizeMiB = 4096
	MaxCPUs            = 64
	MinMemoryMiB       = 64
	MinDiskSizeMiB     = 16
)

// Idle actions (the root package's IdleRemove, IdleStop, IdleSuspend).
const (
	IdleRemove  = "remove"
	IdleStop    = "stop"
	IdleSuspend = "suspend"
)

// Options are the root package's BoxOptions, field for field, in the same
// order and with the same JSON names (PoolKey hashes their JSON form).
type Options struct {
	Image          string
	Name           string
	CPUs           int
	MemoryMiB      int
	DiskSizeMiB    int
	Env            []string
	WorkingDir     string
	User           string
	AutoRemove     bool
	Network        string
	Volumes        []boxrecord.Volume `json:",omitempty"`
	Hostname       string             `json:",omitempty"`
	FromSnapshot   string
	AllowNet       []string                `json:",omitempty"`
	DenyNet        []string                `json:",omitempty"`
	AllowHostPorts []int                   `json:",omitempty"`
	Ports          []boxrecord.Port        `json:",omitempty"`
	TTL            time.Duration           `json:",omitempty"`
	IdleTimeout    time.Duration           `json:",omitempty"`
	IdleAction     string                  `json:",omitempty"`
	Secrets        map[string]secrets.Spec `json:",omitempty"`
	Lease          time.Duration           `json:",omitempty"`
	Labels         map[string]string       `json:",omitempty"`
}

// Defaults fills in the fields of o left zero and checks o; a problem is
// an ErrInvalid.
func Defaults(o Options) (Options, error) {
	if o.Image == "" {
		o.Image = DefaultImage
	}
	if o.CPUs == 0 {
		o.CPUs = DefaultCPUs
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = DefaultMemoryMiB
	}
	if o.DiskSizeMiB == 0 {
		o.DiskSizeMiB = DefaultDiskSizeMiB
	}
	if err := CheckNetwork(&o); err != nil {
		return o, err
	}
	if o.CPUs < 0 || o.CPUs > MaxCPUs {
		return o, fmt.Errorf("%w: cpus %d: want 1..%d", ErrInvalid, o.CPUs, MaxCPUs)
	}
	if o.MemoryMiB < MinMemoryMiB {
		return o, fmt.Errorf("%w: memory %d MiB: want at least %d", ErrInvalid, o.MemoryMiB, MinMemoryMiB)
	}
	if err := checkHostname(o.Hostname); err != nil {
		return o, err
	}
	if o.DiskSizeMiB < MinDiskSizeMiB {
		return o, fmt.Errorf("%w: disk size %d MiB: want at least %d", ErrInvalid, o.DiskSizeMiB, MinDiskSizeMiB)
	}
	if err := CheckVolumes(o.Volumes); err != nil {
		return o, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := boxrecord.CheckLabels(o.Labels); err != nil {
		return o, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := checkSecrets(&o); err != nil {
		return o, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return o, CheckLife(o)
}

func checkHostname(h string) error {
	if h != "" && !guestabi.ValidHostname(h) {
		return fmt.Errorf("%w: hostname %q: want letters, digits and '-', at most 63", ErrInvalid, h)
	}
	return nil
}

// CheckVolumes checks each of vs and refuses two at one target
// (volume.CheckMounts).
func CheckVolumes(vs []boxrecord.Volume) error {
	ms := make([]volume.Mount, len(vs))
	for i, v := range vs {
		ms[i] = volume.Mount(v)
	}
	return volume.CheckMounts(ms)
}

// Mode returns the canonical network mode of a stored or given mode
// (netstack.CanonicalMode).
func Mode(mode string, allow []string) string { return netstack.CanonicalMode(mode, allow) }

// DenyMode is mode, or public when mode is unset and deny is not: AllowNet
// beside DenyNet lists exceptions to it, not an allowlist.
func DenyMode(mode string, deny []string) string {
	if mode == "" && len(deny) > 0 {
		return netstack.ModePublic
	}
	return mode
}

// CheckNetwork fills in and checks the network fields of o
// (netstack.CheckOptions); a problem is an ErrInvalid.
func CheckNetwork(o *Options) error {
	o.Network = Mode(DenyMode(o.Network, o.DenyNet), o.AllowNet)
	pub := Publishes(o.Ports)
	if err := netstack.CheckOptions(o.Network, o.AllowNet, o.DenyNet, o.AllowHostPorts, pub); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for i, p := range pub {
		o.Ports[i] = Port(p)
	}
	return nil
}

// Policy is the network policy of a box of options o (its mode made
// canonical), with the hosts of the secrets of a box of options with
// added, on port 443, to an allowlist (secrets.Policy): a secret's hosts
// are reachable by its box.
func Policy(o, with Options) netstack.Policy {
	p := netstack.BoxPolicy(Mode(o.Network, o.AllowNet), o.AllowNet, o.DenyNet, o.AllowHostPorts)
	if Mode(with.Network, with.AllowNet) == netstack.ModeNone {
		return p
	}
	return secrets.Policy(p, with.Secrets)
}

// Publishes are ports as the network helper publishes them; Port is one
// of them as a stored port.
func Publishes(ports []boxrecord.Port) []netstack.Publish {
	var pub []netstack.Publish
	for _, p := range ports {
		pub = append(pub, netstack.Publish{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Proto: p.Protocol})
	}
	return pub
}

// Port is p as a stored port (and the root package's PortMapping).
func Port(p netstack.Publish) boxrecord.Port {
	return boxrecord.Port{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Protocol: p.Proto}
}

// checkSecrets checks and canonicalises o.Secrets (names, values, hosts,
// bounds; a network; no Env entry of the same name).
func checkSecrets(o *Options) error {
	if len(o.Secrets) == 0 {
		return nil
	}
	if len(o.Secrets) > netstack.MaxSecrets {
		return fmt.Errorf("%d secrets: at most %d", len(o.Secrets), netstack.MaxSecrets)
	}
	if Mode(o.Network, o.AllowNet) == netstack.ModeNone {
		return fmt.Errorf("secrets need a network: not with network mode %q", netstack.ModeNone)
	}
	out, err := secrets.Check(o.Secrets, o.Env)
	if err != nil {
		return err
	}
	o.Secrets = out
	return nil
}

// CheckLife checks the lifetime options: TTL, idle timeout and action,
// lease.
func CheckLife(o Options) error {
	if err := (lifetime.Limits{TTL: o.TTL, Idle: o.IdleTimeout, Lease: o.Lease}).Check(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	switch o.IdleAction {
	case "", IdleRemove, IdleStop, IdleSuspend:
	default:
		return fmt.Errorf("%w: idle action %q: want %s, %s or %s", ErrInvalid, o.IdleAction, IdleRemove, IdleStop, IdleSuspend)
	}
	if o.IdleAction != "" && o.IdleTimeout <= 0 {
		return fmt.Errorf("%w: idle action %s without an idle timeout: set the idle timeout too", ErrInvalid, o.IdleAction)
	}
	if o.IdleAction == IdleSuspend && len(o.Volumes) > 0 {
		return fmt.Errorf("%w: idle action suspend: boxes with volumes cannot be suspended (QEMU cannot save a mounted share); use idle action stop", ErrInvalid)
	}
	return nil
}

// Restore is the options of a box restored from snapshot name, whose
// box had options so and image digest, that the caller asked opts for:
// the snapshot's machine, image and network, with the caller's host side
// (see BoxOptions.FromSnapshot).
func Restore(name string, so Options, digest string, opts Options) (Options, error) {
	if opts.Image != "" && opts.Image != so.Image && opts.Image != digest {
		return Options{}, fmt.Errorf("%w: snapshot %s is of image %s, not %s: leave the image out", ErrInvalid, name, so.Image, opts.Image)
	}
	for _, f := range []struct {
		what      string
		got, want int
	}{{"CPUs", opts.CPUs, so.CPUs}, {"MemoryMiB", opts.MemoryMiB, so.MemoryMiB}, {"DiskSizeMiB", opts.DiskSizeMiB, so.DiskSizeMiB}} {
		if f.got != 0 && f.got != f.want {
			return Options{}, fmt.Errorf("%w: snapshot %s has %s %d, not %d: a restored box keeps its machine; leave it out", ErrInvalid, name, f.what, f.want, f.got)
		}
	}
	if opts.Network != "" && opts.Network != so.Network && (Mode(opts.Network, nil) == netstack.ModeNone || so.Network == netstack.ModeNone) {
		return Options{}, fmt.Errorf("%w: snapshot %s has network %s, not %s: leave it out", ErrInvalid, name, so.Network, opts.Network)
	}
	o := so
	o.Name, o.AutoRemove, o.FromSnapshot = opts.Name, opts.AutoRemove, name
	o.TTL, o.IdleTimeout, o.IdleAction, o.Lease = opts.TTL, opts.IdleTimeout, opts.IdleAction, opts.Lease // the caller's, not the snapshot's box's
	if err := restoredHostSide(&o, opts, name); err != nil {
		return Options{}, err
	}
	if opts.Env != nil {
		o.Env = opts.Env
	}
	if opts.Labels != nil {
		// The caller's labels, as its Env: they describe the new box
		// (an E2B sandbox made from a snapshot has its own metadata).
		o.Labels = opts.Labels
	}
	if opts.WorkingDir != "" {
		o.WorkingDir = opts.WorkingDir
	}
	if opts.User != "" {
		o.User = opts.User
	}
	return o, nil
}

// restoredHostSide gives o, the options of a box restored from snapshot
// name, what is the new box's own and lives on the host: its hostname,
// its published ports (never the snapshot's box's: they are its host
// ports) and, when the caller names one, its network policy (the network
// helper is the new box's; the guest's device is the same for public and
// allowlist). They used to be dropped without a word: `run --from S
// --allow-net pypi.org` ran with the snapshot's public network.
// Volumes cannot be attached to a restored machine: refused.
func restoredHostSide(o *Options, opts Options, name string) error {
	if len(opts.Volumes) > 0 {
		return fmt.Errorf("%w: snapshot %s: a restored box cannot take volumes (-v): its machine is the snapshot's, which had none; copy files in with 'airlock cp' instead", ErrInvalid, name)
	}
	o.Hostname, o.Ports = opts.Hostname, opts.Ports
	// Secrets are the caller's (with fresh placeholders and CA): a
	// snapshot has no values.
	o.Secrets = opts.Secrets
	if o.Network == netstack.ModeNone {
		if len(opts.AllowNet) > 0 || len(opts.DenyNet) > 0 || len(opts.AllowHostPorts) > 0 || len(opts.Ports) > 0 {
			return fmt.Errorf("%w: snapshot %s has no network (none): --allow-net, --allow-host-port and -p need one", ErrInvalid, name)
		}
		return nil
	}
	if opts.Network != "" {
		o.Network = opts.Network // public or allowlist (none is refused before)
	}
	switch {
	case len(opts.DenyNet) > 0:
		o.Network, o.AllowNet, o.DenyNet = netstack.ModePublic, opts.AllowNet, opts.DenyNet
	case len(opts.AllowNet) > 0:
		o.Network, o.AllowNet, o.DenyNet = netstack.ModeAllowlist, opts.AllowNet, nil
	}
	if o.Network == netstack.ModeAllowlist {
		o.DenyNet = nil
	}
	if len(opts.AllowHostPorts) > 0 {
		o.AllowHostPorts = opts.AllowHostPorts
	}
	if err := checkHostname(o.Hostname); err != nil {
		return err
	}
	if err := CheckNetwork(o); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

// Archived decodes and checks the box configuration an archive carries
// (raw): the options of the imported box, named name, of image. What
// names host resources (volumes, published ports, host ports), or this
// host's owner, stays behind.
func Archived(raw []byte, name, image string) (Options, error) {
	o, _, err := Decode(raw)
	if err != nil {
		return Options{}, fmt.Errorf("the archive's box configuration: %w", err)
	}
	o.Volumes, o.Ports, o.AllowHostPorts, o.AutoRemove, o.FromSnapshot = nil, nil, nil, false, ""
	o.Name, o.Image = name, image
	if o, err = Defaults(o); err != nil {
		return Options{}, fmt.Errorf("the archive's box configuration: %w", err)
	}
	return o, nil
}

// PoolKey is the key of the warm pool that boxes of opts come from, and
// opts with defaults; ok is false when opts cannot come from a pool.
func PoolKey(opts Options) (key string, o Options, ok bool) {
	if opts.FromSnapshot != "" || len(opts.Volumes) > 0 || len(opts.Ports) > 0 || len(opts.Secrets) > 0 {
		// (A box with secrets has its own CA and placeholders from its
		// creation: never a pool's.)
		return "", opts, false
	}
	o, err := Defaults(opts)
	if err != nil {
		return "", opts, false
	}
	k := o
	k.Name, k.Hostname, k.AutoRemove = "", "", false
	k.TTL, k.IdleTimeout, k.IdleAction, k.Lease = 0, 0, "", 0 // the claimer's, from its claim
	k.Labels = nil
	if len(k.Env) == 0 {
		k.Env = nil
	}
	if len(k.AllowNet) == 0 {
		k.AllowNet = nil
	}
	if len(k.DenyNet) == 0 {
		k.DenyNet = nil
	}
	if len(k.AllowHostPorts) == 0 {
		k.AllowHostPorts = nil
	}
	raw, _ := json.Marshal(k)
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:])[:16], o, true
}

// Pool checks the box options o of a warm pool of size boxes (1 to
// maxSize) and returns its key (PoolKey) and the options of its boxes:
// unnamed, AutoRemove (a claim gives them the claimer's).
func Pool(o Options, size, maxSize int) (key string, _ Options, err error) {
	if len(o.Volumes) > 0 || len(o.Ports) > 0 || len(o.Secrets) > 0 {
		return "", o, fmt.Errorf("%w: pool boxes cannot have volumes, published ports or secrets; give those to boxes created without a pool", ErrInvalid)
	}
	if size < 1 || size > maxSize {
		return "", o, fmt.Errorf("%w: size %d: want 1..%d", ErrInvalid, size, maxSize)
	}
	o.FromSnapshot = ""
	key, out, ok := PoolKey(o)
	if !ok {
		_, err := Defaults(o)
		return "", o, err
	}
	out.Name, out.Hostname, out.AutoRemove = "", "", true
	return key, out, nil
}

// Meta is what a box's record holds beside its options: the image config
// resolved at creation, its owner, its pool mark, its lifetime deadlines
// and its secrets' placeholders.
type Meta struct {
	Image image.ImageConfig
	// OwnerPID and OwnerStart identify the process that created an
	// AutoRemove box: when it is gone, the next Open removes the box, so
	// that a crashed or killed program leaves no VM behind.
	OwnerPID   int
	OwnerStart uint64
	// Pool is the key of the warm pool holding the box, "" once claimed
	// (or never pooled): such a box is not listed and Get does not find it.
	Pool string
	// The lifetime deadlines: when the TTL ends, when the lease runs out,
	// and the last use recorded (for IdleTimeout). Zero when the box has
	// no such limit.
	ExpiresAt, LeaseUntil, LastUse time.Time
	// Placeholders are the box's secrets' placeholders by name (see
	// BoxOptions.Secrets), made at creation.
	Placeholders map[string]string
}

// New is the record of a new box of options o and image config ic, for
// warm pool pool ("" for a caller's box), made at now: its secrets'
// placeholders and its lifetime deadlines (StartLife).
func New(o Options, ic image.ImageConfig, pool string, now time.Time, grace time.Duration) (Meta, error) {
	m := Meta{Image: ic, Pool: pool}
	var err error
	m.Placeholders, err = secrets.NewPlaceholders(o.Secrets)
	m.StartLife(o, now, grace)
	return m, err
}

// StartLife sets m's lifetime deadlines for a box of options o whose
// record is made at now, before its boot (lifetime.Start; grace: the
// boot's).
func (m *Meta) StartLife(o Options, now time.Time, grace time.Duration) {
	d := lifetime.Start(lifetime.Limits{TTL: o.TTL, Idle: o.IdleTimeout, Lease: o.Lease}, now, grace)
	m.ExpiresAt, m.LeaseUntil, m.LastUse = d.ExpiresAt, d.LeaseUntil, d.LastUse
}

// Claim is pool box (o, m) once a caller who asked for claim takes it, at
// now: its name, hostname, AutoRemove, lifetime and labels are the
// caller's; it has no pool mark, and an owner only when AutoRemove; its
// lifetime deadlines start again (StartLife).
func Claim(o Options, m Meta, claim Options, now time.Time, grace time.Duration) (Options, Meta) {
	m.Pool = ""
	o.Name, o.Hostname, o.AutoRemove, o.FromSnapshot = claim.Name, claim.Hostname, claim.AutoRemove, ""
	if !claim.AutoRemove {
		m.OwnerPID, m.OwnerStart = 0, 0
	}
	o.TTL, o.IdleTimeout, o.IdleAction, o.Lease = claim.TTL, claim.IdleTimeout, claim.IdleAction, claim.Lease
	o.Labels = claim.Labels
	m.StartLife(o, now, grace)
	return o, m
}

// storedNetwork maps a checked network mode to its stored name.
func storedNetwork(mode string) string {
	switch mode {
	case netstack.ModeDisabled, netstack.ModeNone:
		return boxrecord.NetNone
	case netstack.ModeAllowlist:
		return boxrecord.NetAllowlist
	}
	return boxrecord.NetPublic
}

// Encode is the stored form of a box of options o and m
// (boxrecord.Encode).
func Encode(o Options, m Meta) []byte {
	ic := m.Image
	r := boxrecord.Record{Image: o.Image, Name: o.Name, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB,
		DiskSizeMiB: o.DiskSizeMiB, Env: o.Env, WorkingDir: o.WorkingDir, User: o.User, AutoRemove: o.AutoRemove,
		Network: storedNetwork(o.Network), AllowNet: o.AllowNet, DenyNet: o.DenyNet, AllowHostPorts: o.AllowHostPorts, Hostname: o.Hostname,
		ImageConfig: boxrecord.Image{Env: ic.Env, WorkingDir: ic.WorkingDir, User: ic.User, Entrypoint: ic.Entrypoint,
			Cmd: ic.Cmd, Labels: ic.Labels},
		OwnerPID: m.OwnerPID, OwnerStart: m.OwnerStart, FromSnapshot: o.FromSnapshot, Pool: m.Pool,
		TTLMs: boxrecord.Ms(o.TTL), IdleMs: boxrecord.Ms(o.IdleTimeout), LeaseMs: boxrecord.Ms(o.Lease),
		ExpiresAtMs: boxrecord.UnixMs(m.ExpiresAt), LeaseUntilMs: boxrecord.UnixMs(m.LeaseUntil), LastUseMs: boxrecord.UnixMs(m.LastUse),
		IdleAction: o.IdleAction, Labels: o.Labels, Ports: o.Ports, Volumes: o.Volumes}
	r.Secrets = secrets.Stored(o.Secrets, m.Placeholders)
	return boxrecord.Encode(r)
}

// Decode decodes a stored configuration of any version.
func Decode(raw []byte) (Options, Meta, error) {
	r, err := boxrecord.Decode(raw)
	if err != nil {
		return Options{}, Meta{}, err
	}
	stored, err := boxrecord.Network(r.Network)
	if err != nil {
		return Options{}, Meta{}, err
	}
	ic := r.ImageConfig
	o := Options{Image: r.Image, Name: r.Name, CPUs: r.CPUs, MemoryMiB: r.MemoryMiB, DiskSizeMiB: r.DiskSizeMiB,
		Env: r.Env, WorkingDir: r.WorkingDir, User: r.User, AutoRemove: r.AutoRemove, Hostname: r.Hostname,
		Network:  stored, // the stored names are the modes' (public, allowlist, none)
		AllowNet: r.AllowNet, DenyNet: r.DenyNet, AllowHostPorts: r.AllowHostPorts, FromSnapshot: r.FromSnapshot,
		TTL: boxrecord.Duration(r.TTLMs), IdleTimeout: boxrecord.Duration(r.IdleMs), Lease: boxrecord.Duration(r.LeaseMs),
		IdleAction: r.IdleAction, Labels: r.Labels, Volumes: r.Volumes, Ports: r.Ports}
	m := Meta{Image: image.ImageConfig{Env: ic.Env, WorkingDir: ic.WorkingDir, User: ic.User, Entrypoint: ic.Entrypoint,
		Cmd: ic.Cmd, Labels: ic.Labels},
		OwnerPID: r.OwnerPID, OwnerStart: r.OwnerStart, Pool: r.Pool,
		ExpiresAt: boxrecord.Time(r.ExpiresAtMs), LeaseUntil: boxrecord.Time(r.LeaseUntilMs), LastUse: boxrecord.Time(r.LastUseMs)}
	o.Secrets, m.Placeholders = secrets.FromStored[secrets.Spec](r.Secrets)
	return o, m, nil
}
