package airlock

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/store"
)

// boxConfig is what a box is, as the lifecycle code uses it: its options
// and the image config resolved at creation. It is stored as a boxRecord.
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
}

// recordVersion is the schema version of boxRecord. A change that an older
// airlock would misread bumps it, with a case in decodeRecord for the old
// form (and, if the store must rewrite records, a store migration calling
// upgradeConfig).
const recordVersion = 1

// boxRecord is the stored form of a boxConfig (store.Box.Config). Its json
// names are the storage format: renaming a Go field changes nothing on
// disk. Version 0 was the public BoxOptions marshalled as is (see
// recordV0).
type boxRecord struct {
	Version     int      `json:"v"`
	Image       string   `json:"image"`
	Name        string   `json:"name,omitempty"`
	CPUs        int      `json:"cpus"`
	MemoryMiB   int      `json:"memory_mib"`
	DiskSizeMiB int      `json:"disk_mib"`
	Env         []string `json:"env,omitempty"`
	WorkingDir  string   `json:"workdir,omitempty"`
	User        string   `json:"user,omitempty"`
	AutoRemove  bool     `json:"auto_remove,omitempty"`
	Network     string   `json:"network"` // netPublic, netAllowlist or netNone
	// The network policy (optional fields, added in version 1 without a
	// bump: records without them have none).
	AllowNet       []string     `json:"allow_net,omitempty"`
	AllowHostPorts []int        `json:"allow_host_ports,omitempty"`
	Ports          []portRecord `json:"ports,omitempty"`
	// Hostname is BoxOptions.Hostname (optional: "" for records before
	// it, which take the name or id).
	Hostname    string      `json:"hostname,omitempty"`
	ImageConfig imageRecord `json:"image_config"`
	OwnerPID    int         `json:"owner_pid,omitempty"`
	OwnerStart  uint64      `json:"owner_start,omitempty"`
	// Volumes: optional, added in version 1 without a bump (absent = none).
	Volumes []volumeRecord `json:"volumes,omitempty"`
	// FromSnapshot is the snapshot the box was restored from (its first
	// start; later starts boot).
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Pool: the warm pool holding the box (boxConfig.Pool); optional.
	Pool string `json:"pool,omitempty"`
	// Lifetimes: optional, added in version 1 without a bump (absent =
	// none; an older airlock reading them ignores them, and does not
	// enforce them). Durations in milliseconds, times in Unix
	// milliseconds.
	TTLMs        int64 `json:"ttl_ms,omitempty"`
	IdleMs       int64 `json:"idle_timeout_ms,omitempty"`
	LeaseMs      int64 `json:"lease_ms,omitempty"`
	ExpiresAtMs  int64 `json:"expires_at_ms,omitempty"`
	LeaseUntilMs int64 `json:"lease_until_ms,omitempty"`
	LastUseMs    int64 `json:"last_use_ms,omitempty"`
}

// unixMs is t in Unix milliseconds, 0 for the zero time.
func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// durMs is d in milliseconds, rounded up (a positive d stays a limit).
func durMs(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// msDur is durMs's inverse, saturating (a stored value past what a
// Duration holds is the longest one, not a negative one).
func msDur(ms int64) time.Duration {
	if ms <= 0 {
		return 0
	}
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// msTime is unixMs's inverse.
func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// volumeRecord is the stored form of a Volume.
type volumeRecord struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"ro,omitempty"`
}

// portRecord is the stored form of a PortMapping.
type portRecord struct {
	HostIP    string `json:"host_ip,omitempty"`
	HostPort  int    `json:"host_port"`
	GuestPort int    `json:"guest_port"`
	Protocol  string `json:"protocol,omitempty"`
}

func portRecords(ps []PortMapping) []portRecord {
	var out []portRecord
	for _, p := range ps {
		out = append(out, portRecord{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Protocol: p.Protocol})
	}
	return out
}

func portMappings(ps []portRecord) []PortMapping {
	var out []PortMapping
	for _, p := range ps {
		out = append(out, PortMapping{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort, Protocol: p.Protocol})
	}
	return out
}

type imageRecord struct {
	Env        []string          `json:"env,omitempty"`
	WorkingDir string            `json:"workdir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// Stored network modes. Records before version 1 said "enabled" and
// "disabled".
const (
	netPublic    = "public"
	netAllowlist = "allowlist"
	netNone      = "none"
)

// storedNetwork maps BoxOptions.Network (checked: checkNetwork) to its
// stored name.
func storedNetwork(opt NetworkMode) string {
	switch opt {
	case NetworkDisabled, NetworkNone:
		return netNone
	case NetworkAllowlist:
		return netAllowlist
	}
	return netPublic
}

// optionNetwork maps a stored network mode (any version's) to
// BoxOptions.Network.
func optionNetwork(stored string) (NetworkMode, error) {
	switch stored {
	case netPublic, "enabled", "":
		return NetworkPublic, nil
	case netAllowlist:
		return NetworkAllowlist, nil
	case netNone, "disabled":
		return NetworkNone, nil
	}
	return "", fmt.Errorf("unknown network mode %q", stored)
}

func encodeConfig(c boxConfig) []byte {
	o, ic := c.Options, c.Image
	r := boxRecord{Version: recordVersion, Image: o.Image, Name: o.Name, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB,
		DiskSizeMiB: o.DiskSizeMiB, Env: o.Env, WorkingDir: o.WorkingDir, User: o.User, AutoRemove: o.AutoRemove,
		Network: storedNetwork(o.Network), AllowNet: o.AllowNet, AllowHostPorts: o.AllowHostPorts, Ports: portRecords(o.Ports), Hostname: o.Hostname,
		ImageConfig: imageRecord{Env: ic.Env, WorkingDir: ic.WorkingDir, User: ic.User, Entrypoint: ic.Entrypoint,
			Cmd: ic.Cmd, Labels: ic.Labels},
		OwnerPID: c.OwnerPID, OwnerStart: c.OwnerStart, FromSnapshot: o.FromSnapshot, Pool: c.Pool,
		TTLMs: durMs(o.TTL), IdleMs: durMs(o.IdleTimeout), LeaseMs: durMs(o.Lease),
		ExpiresAtMs: unixMs(c.ExpiresAt), LeaseUntilMs: unixMs(c.LeaseUntil), LastUseMs: unixMs(c.LastUse)}
	for _, v := range o.Volumes {
		r.Volumes = append(r.Volumes, volumeRecord{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // strings, ints and bools only
	}
	return b
}

// recordV0 is the stored form before schema versions: boxConfig holding
// the public BoxOptions and image.ImageConfig, marshalled without json tags.
type recordV0 struct {
	Options struct {
		Image                        string
		Name                         string
		CPUs, MemoryMiB, DiskSizeMiB int
		Env                          []string
		WorkingDir, User             string
		AutoRemove                   bool
		Network                      string
		Hostname                     string // written by development builds only
		// The network branch's fields, stored before versions too.
		AllowNet       []string
		AllowHostPorts []int
		Ports          []portRecord
	} `json:"options"`
	Image struct {
		Env             []string
		WorkingDir      string
		User            string
		Entrypoint, Cmd []string
		Labels          map[string]string
	} `json:"image"`
	OwnerPID   int    `json:"owner_pid,omitempty"`
	OwnerStart uint64 `json:"owner_start,omitempty"`
}

// decodeRecord reads a stored configuration of any version up to
// recordVersion.
func decodeRecord(raw []byte) (boxRecord, error) {
	var v struct {
		Version int `json:"v"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return boxRecord{}, err
	}
	switch v.Version {
	case 0:
		var o recordV0
		if err := json.Unmarshal(raw, &o); err != nil {
			return boxRecord{}, err
		}
		oo, oi := o.Options, o.Image
		return boxRecord{Version: recordVersion, Image: oo.Image, Name: oo.Name, CPUs: oo.CPUs, MemoryMiB: oo.MemoryMiB,
			DiskSizeMiB: oo.DiskSizeMiB, Env: oo.Env, WorkingDir: oo.WorkingDir, User: oo.User, AutoRemove: oo.AutoRemove,
			Network: storedNetwork(mustNetwork(oo.Network)), AllowNet: oo.AllowNet, AllowHostPorts: oo.AllowHostPorts, Ports: oo.Ports, Hostname: oo.Hostname,
			ImageConfig: imageRecord{Env: oi.Env, WorkingDir: oi.WorkingDir, User: oi.User, Entrypoint: oi.Entrypoint,
				Cmd: oi.Cmd, Labels: oi.Labels},
			OwnerPID: o.OwnerPID, OwnerStart: o.OwnerStart}, nil
	case recordVersion:
		var r boxRecord
		err := json.Unmarshal(raw, &r)
		return r, err
	}
	return boxRecord{}, fmt.Errorf("record version %d is newer than this airlock understands (%d): upgrade airlock", v.Version, recordVersion)
}

// mustNetwork maps an old stored mode, keeping an unknown one as public
// (what version 0 did with any value but "disabled").
func mustNetwork(stored string) NetworkMode {
	n, err := optionNetwork(stored)
	if err != nil {
		return NetworkPublic
	}
	return n
}

// upgradeConfig rewrites a stored configuration of any version in the
// current one; the store's migration runs it over every record.
func upgradeConfig(raw []byte) ([]byte, error) {
	r, err := decodeRecord(raw)
	if err != nil {
		return nil, err
	}
	c, err := r.config()
	if err != nil {
		return nil, err
	}
	return encodeConfig(c), nil
}

func (r boxRecord) config() (boxConfig, error) {
	n, err := optionNetwork(r.Network)
	if err != nil {
		return boxConfig{}, err
	}
	ic := r.ImageConfig
	var vols []Volume
	for _, v := range r.Volumes {
		vols = append(vols, Volume{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	return boxConfig{
		Options: BoxOptions{Image: r.Image, Name: r.Name, CPUs: r.CPUs, MemoryMiB: r.MemoryMiB, DiskSizeMiB: r.DiskSizeMiB,
			Env: r.Env, WorkingDir: r.WorkingDir, User: r.User, AutoRemove: r.AutoRemove, Network: n, Hostname: r.Hostname, Volumes: vols,
			AllowNet: r.AllowNet, AllowHostPorts: r.AllowHostPorts, Ports: portMappings(r.Ports),
			FromSnapshot: r.FromSnapshot,
			TTL:          msDur(r.TTLMs), IdleTimeout: msDur(r.IdleMs), Lease: msDur(r.LeaseMs)},
		Image: image.ImageConfig{Env: ic.Env, WorkingDir: ic.WorkingDir, User: ic.User, Entrypoint: ic.Entrypoint,
			Cmd: ic.Cmd, Labels: ic.Labels},
		OwnerPID: r.OwnerPID, OwnerStart: r.OwnerStart, Pool: r.Pool,
		ExpiresAt: msTime(r.ExpiresAtMs), LeaseUntil: msTime(r.LeaseUntilMs), LastUse: msTime(r.LastUseMs),
	}, nil
}

// errBadRecord marks a box configuration that cannot be decoded.
var errBadRecord = errors.New("unreadable box record")

// decodeConfig decodes rec's configuration; its errors match errBadRecord.
func decodeConfig(rec *store.Box) (boxConfig, error) {
	r, err := decodeRecord(rec.Config)
	if err == nil {
		var c boxConfig
		if c, err = r.config(); err == nil {
			return c, nil
		}
	}
	return boxConfig{}, fmt.Errorf("box %s: its record cannot be read (%v): remove the box and create it again: %w", rec.ID, err, errBadRecord)
}
