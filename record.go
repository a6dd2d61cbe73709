package airlock

import (
	"errors"
	"fmt"

	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/boxrecord"
	"github.com/airlock-run/airlock/internal/secrets"
	"github.com/airlock-run/airlock/internal/store"
)

// boxConfig is what a box is, as the lifecycle code uses it: its options
// and what its record holds beside them (boxopts.Meta: the image config
// resolved at creation, its owner, pool mark, lifetime deadlines and
// secrets' placeholders). It is stored as a boxrecord.Record
// (boxopts.Encode).
type boxConfig struct {
	Options BoxOptions
	boxopts.Meta
}

// plain is o as internal/boxopts takes it: the same fields.
func (o BoxOptions) plain() boxopts.Options {
	return boxopts.Options{Image: o.Image, Name: o.Name, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskSizeMiB: o.DiskSizeMiB,
		Env: o.Env, WorkingDir: o.WorkingDir, User: o.User, AutoRemove: o.AutoRemove, Network: string(o.Network),
		Volumes: convert(o.Volumes, func(v Volume) boxrecord.Volume { return boxrecord.Volume(v) }), Hostname: o.Hostname,
		FromSnapshot: o.FromSnapshot, AllowNet: o.AllowNet, DenyNet: o.DenyNet, AllowHostPorts: o.AllowHostPorts,
		Ports: convert(o.Ports, func(p PortMapping) boxrecord.Port { return boxrecord.Port(p) }),
		TTL:   o.TTL, IdleTimeout: o.IdleTimeout, IdleAction: string(o.IdleAction), Secrets: convertMap(o.Secrets, func(s Secret) secrets.Spec { return secrets.Spec(s) }),
		Lease: o.Lease, Labels: o.Labels}
}

// public is o as BoxOptions.
func public(o boxopts.Options) BoxOptions {
	return BoxOptions{Image: o.Image, Name: o.Name, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskSizeMiB: o.DiskSizeMiB,
		Env: o.Env, WorkingDir: o.WorkingDir, User: o.User, AutoRemove: o.AutoRemove, Network: NetworkMode(o.Network),
		Volumes: convert(o.Volumes, func(v boxrecord.Volume) Volume { return Volume(v) }), Hostname: o.Hostname,
		FromSnapshot: o.FromSnapshot, AllowNet: o.AllowNet, DenyNet: o.DenyNet, AllowHostPorts: o.AllowHostPorts,
		Ports: convert(o.Ports, func(p boxrecord.Port) PortMapping { return PortMapping(p) }),
		TTL:   o.TTL, IdleTimeout: o.IdleTimeout, IdleAction: IdleAction(o.IdleAction), Secrets: convertMap(o.Secrets, func(s secrets.Spec) Secret { return Secret(s) }),
		Lease: o.Lease, Labels: o.Labels}
}

// convert is s with f applied to each element (nil for nil).
func convert[F, T any](s []F, f func(F) T) []T {
	if s == nil {
		return nil
	}
	out := make([]T, len(s))
	for i, v := range s {
		out[i] = f(v)
	}
	return out
}

// convertMap is m with f applied to each value (nil for nil).
func convertMap[F, T any](m map[string]F, f func(F) T) map[string]T {
	if m == nil {
		return nil
	}
	out := make(map[string]T, len(m))
	for k, v := range m {
		out[k] = f(v)
	}
	return out
}

// encodeConfig is c's stored form (boxopts.Encode).
func encodeConfig(c boxConfig) []byte { return boxopts.Encode(c.Options.plain(), c.Meta) }

// upgradeConfig rewrites a stored configuration of any version in the
// current one (store.Upgrade).
var upgradeConfig store.Upgrade = boxrecord.Upgrade

// configOf decodes a stored configuration of any version.
func configOf(raw []byte) (boxConfig, error) {
	o, m, err := boxopts.Decode(raw)
	return boxConfig{Options: public(o), Meta: m}, err
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

// withDefaults fills in and checks BoxOptions (boxopts.Defaults).
func withDefaults(o BoxOptions) (BoxOptions, error) {
	p, err := boxopts.Defaults(o.plain())
	return public(p), err
}

// checkLife checks the lifetime options (boxopts.CheckLife).
func checkLife(o BoxOptions) error { return boxopts.CheckLife(o.plain()) }

// checkNetwork fills in and checks the network fields of o
// (boxopts.CheckNetwork); a problem is an ErrInvalidArgument.
func checkNetwork(o *BoxOptions) error {
	p := o.plain()
	err := boxopts.CheckNetwork(&p)
	*o = public(p)
	return err
}
