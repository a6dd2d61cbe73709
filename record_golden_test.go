package airlock

import (
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/store"
)

// TestRecordGolden: the stored form of a box record, byte for byte. A
// change here changes what state.db holds and what older releases read:
// it needs a record version (internal/boxrecord), not an edit of want.
func TestRecordGolden(t *testing.T) {
	at := time.UnixMilli(1700000000123)
	c := boxConfig{
		Options: BoxOptions{Image: "python:slim", Name: "n", CPUs: 2, MemoryMiB: 300, DiskSizeMiB: 100, Env: []string{"A=1"},
			WorkingDir: "/w", User: "u", AutoRemove: true, Network: NetworkAllowlist, Hostname: "h-1",
			AllowNet: []string{"pypi.org"}, AllowHostPorts: []int{8080},
			Ports:        []PortMapping{{HostIP: "127.0.0.1", HostPort: 80, GuestPort: 8000, Protocol: "tcp"}},
			Volumes:      []Volume{{Source: "data", Target: "/data", ReadOnly: true}, {Source: "/h", Target: "/h"}},
			FromSnapshot: "s1", TTL: time.Hour, IdleTimeout: 1500 * time.Microsecond, Lease: time.Second},
		Meta: boxopts.Meta{Image: image.ImageConfig{Env: []string{"PATH=/bin"}, WorkingDir: "/x", User: "1", Entrypoint: []string{"e"}, Cmd: []string{"c"}, Labels: map[string]string{"k": "v"}},
			OwnerPID: 7, OwnerStart: 9, Pool: "p",
			ExpiresAt: at, LeaseUntil: at.Add(time.Second), LastUse: at},
	}
	const want = `{"v":1,"image":"python:slim","name":"n","cpus":2,"memory_mib":300,"disk_mib":100,"env":["A=1"],"workdir":"/w","user":"u","auto_remove":true,"network":"allowlist","allow_net":["pypi.org"],"allow_host_ports":[8080],"ports":[{"host_ip":"127.0.0.1","host_port":80,"guest_port":8000,"protocol":"tcp"}],"hostname":"h-1","image_config":{"env":["PATH=/bin"],"workdir":"/x","user":"1","entrypoint":["e"],"cmd":["c"],"labels":{"k":"v"}},"owner_pid":7,"owner_start":9,"volumes":[{"source":"data","target":"/data","ro":true},{"source":"/h","target":"/h"}],"from_snapshot":"s1","pool":"p","ttl_ms":3600000,"idle_timeout_ms":2,"lease_ms":1000,"expires_at_ms":1700000000123,"lease_until_ms":1700000001123,"last_use_ms":1700000000123}`
	if got := string(encodeConfig(c)); got != want {
		t.Errorf("stored form changed:\n got %s\nwant %s", got, want)
	}
	// The least a record holds: a network mode and the version.
	const min = `{"v":1,"image":"","cpus":0,"memory_mib":0,"disk_mib":0,"network":"none","image_config":{}}`
	if got := string(encodeConfig(boxConfig{Options: BoxOptions{Network: NetworkDisabled}})); got != min {
		t.Errorf("empty record:\n got %s\nwant %s", got, min)
	}
}

// TestRecordUpgrade: the store's migration rewrites records of every
// version as decoding and encoding them here would.
func TestRecordUpgrade(t *testing.T) {
	for _, raw := range []string{
		`{"options":{"Image":"a","Name":"","CPUs":1,"MemoryMiB":512,"DiskSizeMiB":4096,"Env":null,"WorkingDir":"","User":"","AutoRemove":true,"Network":"disabled"},"image":{"Env":["X=1"],"Cmd":["sh"]},"owner_pid":5}`,
		`{"options":{"Image":"a","Network":"allowlist","AllowNet":["pypi.org"],"AllowHostPorts":[8080],"Ports":[{"host_port":80,"guest_port":8000,"protocol":"tcp"}]}}`,
		`{"options":{"Network":"sideways"}}`,
		`{"v":1,"image":"a","cpus":1,"memory_mib":512,"disk_mib":4096,"network":"","image_config":{},"env":[],"ports":[]}`,
		`{"v":1,"network":"enabled","ttl_ms":-5,"idle_timeout_ms":9223372036854775807,"lease_ms":9223372036855,"expires_at_ms":-3,"unknown":1}`,
	} {
		up, err := upgradeConfig([]byte(raw))
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		c, err := decodeConfig(&store.Box{ID: "x", Config: []byte(raw)})
		if err != nil {
			t.Fatal(err)
		}
		if want := encodeConfig(c); string(up) != string(want) {
			t.Errorf("%s upgraded to\n%s\nnot\n%s", raw, up, want)
		}
	}
	for _, raw := range []string{`{"v":1,"network":"sideways"}`, `{"v":2}`, `[`} {
		if up, err := upgradeConfig([]byte(raw)); err == nil {
			t.Errorf("%s upgraded to %s", raw, up)
		}
	}
}
