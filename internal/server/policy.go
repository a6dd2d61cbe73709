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
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/airlock-run/airlock"
)

// Policy is what the operator grants API clients (airlock serve flags).
// Zero caps MaxBoxes, MaxCPUs and MaxMemoryMiB mean no limit beyond the
// library's own; the disk, volume and snapshot caps (MaxDiskMiB,
// MinFreeDiskMiB, MaxVolumes, MaxVolumesMiB, MaxSnapshots) take their
// Default... value when zero and mean no limit when negative (NoLimit),
// so that a server bounds what a token holder can make it write by
// default. Empty grants (AllowVolumeDirs, AllowHostPorts, AllowPublish)
// grant nothing. A request past a cap or outside the grants gets 403
// policy_denied with the reason. It applies to every listener.
type Policy struct {
	// MaxBoxes bounds the boxes of the home that are not stopped
	// (created or running).
	MaxBoxes int
	// MaxSnapshots bounds the memory snapshots of the home (POST
	// /v1/boxes/{id}/snapshot; a fork's own, removed at once, does not
	// count). 0: DefaultMaxSnapshots; negative: no limit.
	MaxSnapshots int
	// MaxDiskMiB bounds one box's writable layer (disk_size_mib), which
	// the box's code can fill on the host's disk, in MiB. 0:
	// DefaultMaxDiskMiB; negative: no limit (the API's own bound, 1 TiB).
	MaxDiskMiB int
	// MinFreeDiskMiB is the space, in MiB, that a create, restore, fork,
	// snapshot, pause to disk, start or resume must leave free on the
	// filesystem of the airlock home once what it may write there is
	// counted in full (new writable layers filled up, the named volumes it
	// creates, a snapshot's memory and disk, a suspended box's memory),
	// and what the boxes not stopped may still write into their disks. 0:
	// DefaultMinFreeDiskMiB; negative: no check.
	MinFreeDiskMiB int
	// MaxVolumes and MaxVolumesMiB bound the named volumes of the home
	// (their number, and their total size in MiB) when a create request
	// would make new ones (each of airlock.DefaultVolumeSizeMiB). 0:
	// DefaultMaxVolumes and DefaultMaxVolumesMiB; negative: no limit.
	MaxVolumes    int
	MaxVolumesMiB int
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
	// AllowImportState lets POST /v1/boxes/import take archives with
	// checkpoints (airlock serve --allow-import-state): their memory and
	// device state, which the client made, is loaded into the box's QEMU
	// at a rollback, and QEMU does not treat device state as untrusted
	// (it runs confined, as for any box). Off, and for a tenant's token
	// always: such archives get 403 policy_denied.
	AllowImportState bool
}

// Defaults of the Policy caps that apply when the field is zero: what a
// single host can give API clients without running out of disk.
const (
	// DefaultMaxDiskMiB bounds a box's writable layer: 16 GiB, four times
	// the library's default disk (airlock.DefaultDiskSizeMiB).
	DefaultMaxDiskMiB = 16 << 10
	// DefaultMinFreeDiskMiB is the free space (2 GiB) that requests
	// leave on the home's filesystem, counting what they may write.
	DefaultMinFreeDiskMiB = 2 << 10
	// DefaultMaxVolumes bounds the named volumes of the home (32).
	DefaultMaxVolumes = 32
	// DefaultMaxVolumesMiB bounds their total size: 32 GiB, 32 volumes
	// of airlock.DefaultVolumeSizeMiB.
	DefaultMaxVolumesMiB = 32 << 10
	// DefaultMaxSnapshots bounds the memory snapshots of the home (32).
	DefaultMaxSnapshots = 32
	// NoLimit, as a Policy cap that has a default, turns the cap off.
	NoLimit = -1
)

// withDefaults fills in the caps left zero.
func (p Policy) withDefaults() Policy {
	for _, c := range []struct {
		v   *int
		def int
	}{{&p.MaxDiskMiB, DefaultMaxDiskMiB}, {&p.MinFreeDiskMiB, DefaultMinFreeDiskMiB}, {&p.MaxVolumes, DefaultMaxVolumes},
		{&p.MaxVolumesMiB, DefaultMaxVolumesMiB}, {&p.MaxSnapshots, DefaultMaxSnapshots}} {
		if *c.v == 0 {
			*c.v = c.def
		}
	}
	return p
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
func (s *Server) checkGrants(ctx context.Context, opts *airlock.BoxOptions) error {
	p, volumeDirs := s.policyFor(ctx)
	for i, v := range opts.Volumes {
		if !v.IsHostDir() {
			if p.DenyNamedVolumes {
				return denied("named volume %q: this server refuses named volumes (airlock serve --allow-named-volumes=false)", v.Source)
			}
			continue
		}
		if len(volumeDirs) == 0 {
			return denied("host volume %s: this server grants no host directories (start it with airlock serve --allow-volume DIR)", v.Source)
		}
		real, err := filepath.EvalSymlinks(filepath.Clean(v.Source))
		if err != nil {
			return denied("host volume %s: cannot resolve it on the server's host (%v): give an existing directory under %s",
				v.Source, errors.Unwrap(err), strings.Join(volumeDirs, ", "))
		}
		ok := false
		for _, d := range volumeDirs {
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
				v.Source, detail, strings.Join(volumeDirs, ", "))
		}
		opts.Volumes[i].Source = real
	}
	if err := s.checkPorts(p, opts); err != nil {
		return err
	}
	for _, port := range opts.AllowHostPorts {
		if !slices.Contains(p.AllowHostPorts, port) {
			return denied("allow_host_ports %d: this server grants host ports %v (airlock serve --allow-host-port)", port, p.AllowHostPorts)
		}
	}
	return checkAllowNet(p, opts.AllowNet)
}

// checkAllowNet applies p's grants to the destinations of an allowlist
// network: IPs and CIDRs inside private ranges need AllowPrivateNet.
func checkAllowNet(p Policy, allow []string) error {
	if p.AllowPrivateNet {
		return nil
	}
	for _, e := range allow {
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
	return nil
}

func denied(format string, a ...any) *Problem {
	return &Problem{Status: http.StatusForbidden, Title: "Forbidden", Code: CodePolicyDenied, Detail: fmt.Sprintf(format, a...)}
}

// checkCreate applies the policy to a create request. On success the
// named volumes the request creates are counted as made until release is
// called (after the create, whatever its outcome), so that concurrent
// requests cannot pass the volume caps together.
func (s *Server) checkCreate(ctx context.Context, opts *airlock.BoxOptions) (release func(), err error) {
	p := s.cfg.Policy
	if err := s.checkGrants(ctx, opts); err != nil {
		return nil, err
	}
	cpus, mem, disk := opts.CPUs, opts.MemoryMiB, opts.DiskSizeMiB
	if cpus == 0 {
		cpus = airlock.DefaultCPUs
	}
	if mem == 0 {
		mem = airlock.DefaultMemoryMiB
	}
	if disk == 0 {
		disk = airlock.DefaultDiskSizeMiB
	}
	if p.MaxCPUs > 0 && cpus > p.MaxCPUs {
		return nil, denied("%d vCPUs asked; this server allows at most %d per box (airlock serve --max-cpus)", cpus, p.MaxCPUs)
	}
	if p.MaxMemoryMiB > 0 && mem > p.MaxMemoryMiB {
		return nil, denied("%d MiB of memory asked; this server allows at most %d MiB per box (airlock serve --max-memory)", mem, p.MaxMemoryMiB)
	}
	if p.MaxDiskMiB > 0 && disk > p.MaxDiskMiB {
		return nil, denied("%d MiB of disk asked; this server allows at most %d MiB per box (airlock serve --max-disk): ask for less disk_size_mib", disk, p.MaxDiskMiB)
	}
	if err := s.checkBoxRoom(ctx, 1, ""); err != nil {
		return nil, err
	}
	releaseQuota, err := s.reserveQuota(ctx, usageOfOptions(*opts, 1), fmt.Sprintf("a box with %d vCPUs, %d MiB of memory and a disk of %d MiB", cpus, mem, disk))
	if err != nil {
		return nil, err
	}
	volMiB, releaseVolumes, err := s.reserveVolumes(ctx, opts.Volumes)
	if err != nil {
		releaseQuota()
		return nil, err
	}
	what := fmt.Sprintf("a box with a disk of %d MiB", disk)
	if volMiB > 0 {
		what += fmt.Sprintf(" and %d MiB of new named volumes", volMiB)
	}
	want := int64(disk) + int64(volMiB)
	if err := s.checkFreeDisk(ctx, what, want); err != nil {
		releaseVolumes()
		releaseQuota()
		return nil, err
	}
	// Until the box is made (and listed, its disk counted as owed),
	// creates beside this one count its disk as taken.
	s.caps.diskMiB.Add(want)
	return func() {
		releaseVolumes()
		releaseQuota()
		s.caps.diskMiB.Add(-want)
	}, nil
}

// capState counts what requests in progress are making that the caps
// count once made. Its zero value is ready.
type capState struct {
	mu        sync.Mutex
	volumes   map[string]int // named volumes being created: MiB by name
	snapshots int            // snapshots being taken
	// diskMiB: the disks (and new volumes) of creates in progress. Not
	// under mu: checkFreeDisk reads it, and callers hold mu around it.
	diskMiB atomic.Int64
}

// reserveVolumes checks the named volumes that vols would create (those
// that do not exist yet) against Policy.MaxVolumes and MaxVolumesMiB and
// counts them as made until release is called. It returns their size.
func (s *Server) reserveVolumes(ctx context.Context, vols []airlock.Volume) (newMiB int, release func(), err error) {
	release = func() {}
	var names []string
	for _, v := range vols {
		if !v.IsHostDir() && !slices.Contains(names, v.Source) {
			names = append(names, v.Source)
		}
	}
	if len(names) == 0 {
		return 0, release, nil
	}
	p := s.cfg.Policy
	c := &s.caps
	c.mu.Lock()
	defer c.mu.Unlock()
	have, err := s.rt.Volumes(ctx)
	if err != nil {
		return 0, nil, problem(err)
	}
	count, total := len(have), 0
	for _, v := range have {
		total += v.SizeMiB
	}
	for n, mib := range c.volumes {
		if !slices.ContainsFunc(have, func(v airlock.VolumeInfo) bool { return v.Name == n }) {
			count++
			total += mib
		}
	}
	var made []string
	for _, n := range names {
		if _, pending := c.volumes[n]; pending || slices.ContainsFunc(have, func(v airlock.VolumeInfo) bool { return v.Name == n }) {
			continue
		}
		made = append(made, n)
	}
	if len(made) == 0 {
		return 0, release, nil
	}
	newMiB = len(made) * airlock.DefaultVolumeSizeMiB
	if p.MaxVolumes > 0 && count+len(made) > p.MaxVolumes {
		return 0, nil, denied("named volume %q: %d named volumes exist; this server keeps at most %d (airlock serve --max-volumes): attach an existing one (airlock volume ls), or remove one first (airlock volume rm)",
			made[0], count, p.MaxVolumes)
	}
	if p.MaxVolumesMiB > 0 && total+newMiB > p.MaxVolumesMiB {
		return 0, nil, denied("named volume %q: the named volumes hold %d MiB; %d MiB more would pass this server's %d MiB (airlock serve --max-volume-space): attach an existing one, or remove one first (airlock volume rm)",
			made[0], total, newMiB, p.MaxVolumesMiB)
	}
	if c.volumes == nil {
		c.volumes = map[string]int{}
	}
	for _, n := range made {
		c.volumes[n] = airlock.DefaultVolumeSizeMiB
	}
	return newMiB, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, n := range made {
			delete(c.volumes, n)
		}
	}, nil
}

// checkFreeDisk refuses making what (a phrase: "a box with a disk of 4096
// MiB") when writing wantMiB more would leave less than
// Policy.MinFreeDiskMiB free on the filesystem of the airlock home, once
// what the boxes not stopped may still write into their disks (each one's
// size less what it holds) is counted too.
func (s *Server) checkFreeDisk(ctx context.Context, what string, wantMiB int64) error {
	reserve := int64(s.cfg.Policy.MinFreeDiskMiB)
	if reserve <= 0 {
		return nil
	}
	home := s.rt.Home()
	var st syscall.Statfs_t
	if err := syscall.Statfs(home, &st); err != nil {
		s.log.Warn("free disk space unknown: not checked", "home", home, "err", err)
		return nil
	}
	free := int64(st.Bavail) * st.Bsize >> 20
	infos, err := s.rt.List(ctx)
	if err != nil {
		return problem(err)
	}
	var owed int64 // MiB
	for _, i := range infos {
		if i.State != airlock.BoxStopped {
			owed += max(0, int64(i.Options.DiskSizeMiB)-i.DiskBytes>>20)
		}
	}
	owed += s.caps.diskMiB.Load() // creates in progress, not listed yet
	if free-owed-wantMiB >= reserve {
		return nil
	}
	return denied("%s: the filesystem of the airlock home (%s) has %d MiB free, the boxes not stopped and the creates in progress may still write %d MiB into their disks and this request %d MiB, and this server keeps %d MiB free (airlock serve --min-free-disk): remove boxes, snapshots or volumes, or ask for less",
		what, home, free, owed, wantMiB, reserve)
}

// checkStart applies the policy to starting box b (start, or resume
// from disk): a stopped box takes a place under Policy.MaxBoxes again, and
// what its disk may still take counts against Policy.MinFreeDiskMiB; for a
// tenant's request, its quotas. A box not stopped passes. Call release
// once the start is done (or failed): until then its vCPUs and memory
// count against the tenant's quotas.
func (s *Server) checkStart(ctx context.Context, b *airlock.Box) (release func(), err error) {
	info, err := b.Info(ctx)
	if err != nil {
		return nil, problem(err)
	}
	if info.State != airlock.BoxStopped {
		return func() {}, nil
	}
	if err := s.checkBoxRoom(ctx, 1, "starting a box: %[2]d boxes are not stopped; this server allows at most %[3]d (airlock serve --max-boxes): stop or remove one first"); err != nil {
		return nil, err
	}
	u := usageOfOptions(info.Options, 1)
	u.diskMiB = 0 // a stopped box's disk is counted already
	release, err = s.reserveQuota(ctx, u, "starting a box")
	if err != nil {
		return nil, err
	}
	disk := int64(info.Options.DiskSizeMiB)
	if err := s.checkFreeDisk(ctx, fmt.Sprintf("starting a box with a disk of %d MiB", disk), max(0, disk-info.DiskBytes>>20)); err != nil {
		release()
		return nil, err
	}
	return release, nil
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
		if i.State != airlock.BoxStopped {
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
