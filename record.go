package airlock

import (
	"errors"
	"fmt"
	"time"

	"github.com/airlock-run/airlock/internal/boxrecord"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/secrets"
	"github.com/airlock-run/airlock/internal/store"
)

// boxConfig is what a box is, as the lifecycle code uses it: its options
// and the image config resolved at creation. It is stored as a
// boxrecord.Record (this file maps one to the other).
type boxConfig struct {
	Options BoxOptions
	Image   image.ImageConfig
	// Owner identifies the process that created an AutoRemove box: when it
	// is gone, the next Open removes the box, so that a crashed or killed
	// program leaves no VM behind.
	OwnerPID   int
	OwnerStart uint64
	// Pool is the key of the warm pool holding the box, "" once claimed
	// (or never pooled): such a box is not listed and Get does not find it.
	Pool string
	// The lifetime deadlines (lifetime.go): when the TTL ends, when the
	// lease runs out, and the last use recorded (for IdleTimeout). Zero
	// when the box has no such limit.
	ExpiresAt, LeaseUntil, LastUse time.Time
	// Placeholders are the box's secrets' placeholders by name (see
	// BoxOptions.Secrets), made at creation.
	Placeholders map[string]string
}

// storedNetwork maps BoxOptions.Network (checked: checkNetwork) to its
// stored name.
func storedNetwork(opt NetworkMode) string {
	switch opt {
	case NetworkDisabled, NetworkNone:
		return boxrecord.NetNone
	case NetworkAllowlist:
		return boxrecord.NetAllowlist
	}
	return boxrecord.NetPublic
}

// encodeConfig is c's stored form (boxrecord.Encode).
func encodeConfig(c boxConfig) []byte {
	o, ic := c.Options, c.Image
	r := boxrecord.Record{Image: o.Image, Name: o.Name, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB,
		DiskSizeMiB: o.DiskSizeMiB, Env: o.Env, WorkingDir: o.WorkingDir, User: o.User, AutoRemove: o.AutoRemove,
		Network: storedNetwork(o.Network), AllowNet: o.AllowNet, DenyNet: o.DenyNet, AllowHostPorts: o.AllowHostPorts, Hostname: o.Hostname,
		ImageConfig: boxrecord.Image{Env: ic.Env, WorkingDir: ic.WorkingDir, User: ic.User, Entrypoint: ic.Entrypoint,
			Cmd: ic.Cmd, Labels: ic.Labels},
		OwnerPID: c.OwnerPID, OwnerStart: c.OwnerStart, FromSnapshot: o.FromSnapshot, Pool: c.Pool,
		TTLMs: boxrecord.Ms(o.TTL), IdleMs: boxrecord.Ms(o.IdleTimeout), LeaseMs: boxrecord.Ms(o.Lease),
		ExpiresAtMs: boxrecord.UnixMs(c.ExpiresAt), LeaseUntilMs: boxrecord.UnixMs(c.LeaseUntil), LastUseMs: boxrecord.UnixMs(c.LastUse),
		IdleAction: string(o.IdleAction), Labels: o.Labels}
	for _, p := range o.Ports {
		r.Ports = append(r.Ports, boxrecord.Port{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Protocol: p.Protocol})
	}
	for _, v := range o.Volumes {
		r.Volumes = append(r.Volumes, boxrecord.Volume{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	r.Secrets = secrets.Stored(o.Secrets, c.Placeholders)
	return boxrecord.Encode(r)
}

// upgradeConfig rewrites a stored configuration of any version in the
// current one (store.Upgrade).
var upgradeConfig store.Upgrade = boxrecord.Upgrade

// configOf decodes a stored configuration of any version.
func configOf(raw []byte) (boxConfig, error) {
	r, err := boxrecord.Decode(raw)
	if err != nil {
		return boxConfig{}, err
	}
	stored, err := boxrecord.Network(r.Network)
	if err != nil {
		return boxConfig{}, err
	}
	ic := r.ImageConfig
	o := BoxOptions{Image: r.Image, Name: r.Name, CPUs: r.CPUs, MemoryMiB: r.MemoryMiB, DiskSizeMiB: r.DiskSizeMiB,
		Env: r.Env, WorkingDir: r.WorkingDir, User: r.User, AutoRemove: r.AutoRemove, Hostname: r.Hostname,
		Network:  NetworkMode(stored), // the stored names are the modes' (NetworkPublic, NetworkAllowlist, NetworkNone)
		AllowNet: r.AllowNet, DenyNet: r.DenyNet, AllowHostPorts: r.AllowHostPorts, FromSnapshot: r.FromSnapshot,
		TTL: boxrecord.Duration(r.TTLMs), IdleTimeout: boxrecord.Duration(r.IdleMs), Lease: boxrecord.Duration(r.LeaseMs),
		IdleAction: IdleAction(r.IdleAction), Labels: r.Labels}
	for _, v := range r.Volumes {
		o.Volumes = append(o.Volumes, Volume{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	for _, p := range r.Ports {
		o.Ports = append(o.Ports, PortMapping{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Protocol: p.Protocol})
	}
	var placeholders map[string]string
	o.Secrets, placeholders = secrets.FromStored[Secret](r.Secrets)
	return boxConfig{Options: o, Placeholders: placeholders,
		Image: image.ImageConfig{Env: ic.Env, WorkingDir: ic.WorkingDir, User: ic.User, Entrypoint: ic.Entrypoint,
			Cmd: ic.Cmd, Labels: ic.Labels},
		OwnerPID: r.OwnerPID, OwnerStart: r.OwnerStart, Pool: r.Pool,
		ExpiresAt: boxrecord.Time(r.ExpiresAtMs), LeaseUntil: boxrecord.Time(r.LeaseUntilMs), LastUse: boxrecord.Time(r.LastUseMs),
	}, nil
}

// errBadRecord marks a box configuration that cannot be decoded.
var errBadRecord = errors.New("unreadable box record")

// decodeConfig decodes rec's configuration; its errors match errBadRecord.
func decodeConfig(rec *store.Box) (boxConfig, error) {
	c, err := configOf(rec.Config)
	if err != nil {
		return boxConfig{}, fmt.Errorf("box %s: its record cannot be read (%v): remove the box and create it again: %w", rec.ID, err, errBadRecord)
	}
	return c, nil
}
