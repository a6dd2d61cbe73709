package boxopts

import (
	"errors"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxrecord"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/secrets"
)

// TestDefaults: zero fields get the defaults; each bound refuses with
// ErrInvalid.
func TestDefaults(t *testing.T) {
	o, err := Defaults(Options{})
	if err != nil || o.Image != DefaultImage || o.CPUs != DefaultCPUs || o.MemoryMiB != DefaultMemoryMiB ||
		o.DiskSizeMiB != DefaultDiskSizeMiB || o.Network != "public" {
		t.Fatalf("zero options: %+v %v", o, err)
	}
	if o, err := Defaults(Options{AllowNet: []string{"pypi.org"}}); err != nil || o.Network != "allowlist" {
		t.Errorf("allow-net without a mode: %+v %v", o, err)
	}
	for name, bad := range map[string]Options{
		"cpus":         {CPUs: MaxCPUs + 1},
		"memory":       {MemoryMiB: MinMemoryMiB - 1},
		"disk":         {DiskSizeMiB: MinDiskSizeMiB - 1},
		"hostname":     {Hostname: "bad_name"},
		"volumes":      {Volumes: []boxrecord.Volume{{Source: "a", Target: "/x"}, {Source: "b", Target: "/x/"}}},
		"network":      {Network: "bogus"},
		"secrets none": {Network: "none", Secrets: map[string]secrets.Spec{"K": {Value: "v", Hosts: []string{"a.example"}}}},
		"idle action":  {IdleAction: IdleStop},
		"negative ttl": {TTL: -time.Second},
		"labels":       {Labels: map[string]string{"": "v"}},
	} {
		if _, err := Defaults(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// TestPoolKey: the key ignores what a claim gives (name, lifetime,
// labels) and tells different machines apart; boxes with volumes,
// ports or secrets have no pool.
func TestPoolKey(t *testing.T) {
	k1, o, ok := PoolKey(Options{Image: "a"})
	if !ok || len(k1) != 16 || o.CPUs != DefaultCPUs {
		t.Fatalf("PoolKey: %q %+v %v", k1, o, ok)
	}
	if k2, _, _ := PoolKey(Options{Image: "a", Name: "n", TTL: time.Hour, Labels: map[string]string{"k": "v"}}); k2 != k1 {
		t.Errorf("a claim's options changed the key: %s != %s", k2, k1)
	}
	if k3, _, _ := PoolKey(Options{Image: "a", CPUs: 2}); k3 == k1 {
		t.Error("2 vCPUs have the key of 1")
	}
	if _, _, ok := PoolKey(Options{Image: "a", Ports: []boxrecord.Port{{GuestPort: 80}}}); ok {
		t.Error("a box with ports has a pool")
	}
	if _, _, err := Pool(Options{Image: "a", Secrets: map[string]secrets.Spec{"K": {Value: "v", Hosts: []string{"a.example"}}}}, 1, 64); !errors.Is(err, ErrInvalid) {
		t.Errorf("a pool of boxes with secrets: %v", err)
	}
	if _, _, err := Pool(Options{Image: "a"}, 65, 64); !errors.Is(err, ErrInvalid) {
		t.Errorf("pool size 65: %v", err)
	}
}

// TestEncodeDecode: options and record survive their stored form.
func TestEncodeDecode(t *testing.T) {
	now := time.UnixMilli(time.Now().UnixMilli())
	o := Options{Image: "a", Name: "n", CPUs: 1, MemoryMiB: 64, DiskSizeMiB: 16, Network: "allowlist", AllowNet: []string{"x.example"},
		Ports: []boxrecord.Port{{HostIP: "127.0.0.1", HostPort: 1, GuestPort: 2, Protocol: "tcp"}}, TTL: time.Hour}
	m, err := New(o, image.ImageConfig{User: "u"}, "p", now, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got, gm, err := Decode(Encode(o, m))
	if err != nil || got.Name != "n" || got.Network != "allowlist" || len(got.Ports) != 1 || got.TTL != time.Hour ||
		gm.Pool != "p" || gm.Image.User != "u" || !gm.ExpiresAt.Equal(m.ExpiresAt) {
		t.Errorf("round trip: %+v %+v %v", got, gm, err)
	}
	// A claim takes the caller's name and lifetime, and drops the mark.
	co, cm := Claim(got, gm, Options{Name: "mine", Lease: time.Minute}, now, time.Minute)
	if co.Name != "mine" || co.TTL != 0 || co.Lease != time.Minute || cm.Pool != "" || cm.LeaseUntil.IsZero() || !cm.ExpiresAt.IsZero() {
		t.Errorf("claim: %+v %+v", co, cm)
	}
}
