// Package boxrecord is the stored form of a box's configuration: the
// versioned JSON record in state.db's config column (store.Box.Config),
// in a snapshot's snapshot.json and in a box archive. It reads every
// version airlock has written and writes the current one; the mapping to
// and from the public options is the caller's.
package boxrecord

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Version is the schema version of Record. A change that an older airlock
// would misread bumps it, with a case in Decode for the old form (and, if
// the store must rewrite records, a store migration calling Upgrade).
const Version = 1

// Record is the stored form of a box. Its json names are the storage
// format: renaming a Go field changes nothing on disk. Version 0 was the
// public BoxOptions marshalled as is (see recordV0).
type Record struct {
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
	Network     string   `json:"network"` // NetPublic, NetAllowlist or NetNone
	// The network policy (optional fields, added in version 1 without a
	// bump: records without them have none).
	AllowNet       []string `json:"allow_net,omitempty"`
	AllowHostPorts []int    `json:"allow_host_ports,omitempty"`
	// DenyNet: a public box's denylist (optional, added in version 1
	// without a bump: absent = none; an airlock older than it ignores it).
	DenyNet []string `json:"deny_net,omitempty"`
	Ports   []Port   `json:"ports,omitempty"`
	// Hostname is BoxOptions.Hostname (optional: "" for records before
	// it, which take the name or id).
	Hostname    string `json:"hostname,omitempty"`
	ImageConfig Image  `json:"image_config"`
	OwnerPID    int    `json:"owner_pid,omitempty"`
	OwnerStart  uint64 `json:"owner_start,omitempty"`
	// Volumes: optional, added in version 1 without a bump (absent = none).
	Volumes []Volume `json:"volumes,omitempty"`
	// FromSnapshot is the snapshot the box was restored from (its first
	// start; later starts boot).
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Pool: the warm pool holding the box; optional.
	Pool string `json:"pool,omitempty"`
	// Lifetimes: optional, added in version 1 without a bump (absent =
	// none; an older airlock reading them ignores them, and does not
	// enforce them). Durations in milliseconds (Ms), times in Unix
	// milliseconds (UnixMs).
	TTLMs        int64 `json:"ttl_ms,omitempty"`
	IdleMs       int64 `json:"idle_timeout_ms,omitempty"`
	LeaseMs      int64 `json:"lease_ms,omitempty"`
	ExpiresAtMs  int64 `json:"expires_at_ms,omitempty"`
	LeaseUntilMs int64 `json:"lease_until_ms,omitempty"`
	LastUseMs    int64 `json:"last_use_ms,omitempty"`
	// IdleAction is what an idle timeout does: "" (remove), "stop" or
	// "suspend"; optional, added in version 1 without a bump (an older
	// airlock ignores it and removes the idle box).
	IdleAction string `json:"idle_action,omitempty"`
	// Labels: optional, added in version 1 without a bump (absent =
	// none).
	Labels map[string]string `json:"labels,omitempty"`
	// Secrets: optional, added in version 1 without a bump (absent =
	// none). Names, hosts and placeholders only: a value is never in a
	// record (it is in the box directory's secrets file).
	Secrets []Secret `json:"secrets,omitempty"`
}

// Secret is the stored form of one of BoxOptions.Secrets, without its
// value: its name, the hosts it is bound to and the placeholder the box's
// environment variable of that name holds.
type Secret struct {
	Name        string   `json:"name"`
	Hosts       []string `json:"hosts"`
	Placeholder string   `json:"placeholder"`
}

// Volume is the stored form of a volume (BoxOptions.Volumes).
type Volume struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"ro,omitempty"`
}

// Port is the stored form of a published port (BoxOptions.Ports).
type Port struct {
	HostIP    string `json:"host_ip,omitempty"`
	HostPort  int    `json:"host_port"`
	GuestPort int    `json:"guest_port"`
	Protocol  string `json:"protocol,omitempty"`
}

// Image is the stored form of the image config resolved at creation.
type Image struct {
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
	NetPublic    = "public"
	NetAllowlist = "allowlist"
	NetNone      = "none"
)

// Network maps a stored network mode of any version to NetPublic,
// NetAllowlist or NetNone; an unknown one is an error.
func Network(stored string) (string, error) {
	switch stored {
	case NetPublic, "enabled", "":
		return NetPublic, nil
	case NetAllowlist:
		return NetAllowlist, nil
	case NetNone, "disabled":
		return NetNone, nil
	}
	return "", fmt.Errorf("unknown network mode %q", stored)
}

// Encode is r's stored form, of version Version (whatever r.Version says).
func Encode(r Record) []byte {
	r.Version = Version
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // strings, ints and bools only
	}
	return b
}

// recordV0 is the stored form before schema versions: the root package's
// boxConfig holding the public BoxOptions and image.ImageConfig,
// marshalled without json tags.
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
		Ports          []Port
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

// Decode reads a stored record of any version up to Version; the result
// has Version's form (its network mode is not checked: see Network).
func Decode(raw []byte) (Record, error) {
	var v struct {
		Version int `json:"v"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return Record{}, err
	}
	switch v.Version {
	case 0:
		var o recordV0
		if err := json.Unmarshal(raw, &o); err != nil {
			return Record{}, err
		}
		oo, oi := o.Options, o.Image
		return Record{Version: Version, Image: oo.Image, Name: oo.Name, CPUs: oo.CPUs, MemoryMiB: oo.MemoryMiB,
			DiskSizeMiB: oo.DiskSizeMiB, Env: oo.Env, WorkingDir: oo.WorkingDir, User: oo.User, AutoRemove: oo.AutoRemove,
			Network: v0Network(oo.Network), AllowNet: oo.AllowNet, AllowHostPorts: oo.AllowHostPorts, Ports: oo.Ports, Hostname: oo.Hostname,
			ImageConfig: Image{Env: oi.Env, WorkingDir: oi.WorkingDir, User: oi.User, Entrypoint: oi.Entrypoint,
				Cmd: oi.Cmd, Labels: oi.Labels},
			OwnerPID: o.OwnerPID, OwnerStart: o.OwnerStart}, nil
	case Version:
		var r Record
		err := json.Unmarshal(raw, &r)
		return r, err
	}
	return Record{}, fmt.Errorf("record version %d is newer than this airlock understands (%d): upgrade airlock", v.Version, Version)
}

// v0Network maps a version 0 mode, keeping an unknown one as public
// (what version 0 did with any value but "disabled").
func v0Network(stored string) string {
	n, err := Network(stored)
	if err != nil {
		return NetPublic
	}
	return n
}

// Upgrade rewrites a stored record of any version in the current one; the
// store's migration runs it over every record. It writes what decoding the
// record into the public options and encoding them again would: the
// network mode named as Network names it (an unknown one is an error),
// durations as Ms(Duration(ms)).
func Upgrade(raw []byte) ([]byte, error) {
	r, err := Decode(raw)
	if err != nil {
		return nil, err
	}
	if r.Network, err = Network(r.Network); err != nil {
		return nil, err
	}
	r.TTLMs, r.IdleMs, r.LeaseMs = Ms(Duration(r.TTLMs)), Ms(Duration(r.IdleMs)), Ms(Duration(r.LeaseMs))
	return Encode(r), nil
}

// UnixMs is t in Unix milliseconds, 0 for the zero time.
func UnixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// Time is UnixMs's inverse.
func Time(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// Ms is d in milliseconds, rounded up (a positive d stays a limit); 0 for
// d <= 0.
func Ms(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// Duration is Ms's inverse, saturating (a stored value past what a
// Duration holds is the longest one, not a negative one).
func Duration(ms int64) time.Duration {
	if ms <= 0 {
		return 0
	}
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}
