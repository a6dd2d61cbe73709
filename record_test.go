package airlock

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/store"
)

func TestRecordRoundTrip(t *testing.T) {
	c := boxConfig{
		Options: BoxOptions{Image: "python:slim", Name: "n", CPUs: 2, MemoryMiB: 300, DiskSizeMiB: 100, Env: []string{"A=1"},
			WorkingDir: "/w", User: "u", AutoRemove: true, Network: NetworkNone, Hostname: "h-1"},
		Meta: boxopts.Meta{Image: image.ImageConfig{Env: []string{"PATH=/bin"}, WorkingDir: "/x", User: "1", Entrypoint: []string{"e"}, Cmd: []string{"c"}, Labels: map[string]string{"k": "v"}},
			OwnerPID: 7, OwnerStart: 9},
	}
	raw := encodeConfig(c)
	if !strings.Contains(string(raw), `"v":1`) || !strings.Contains(string(raw), `"network":"none"`) {
		t.Fatalf("stored form: %s", raw)
	}
	got, err := decodeConfig(&store.Box{ID: "x", Config: raw})
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("round trip:\n got %+v %v\nwant %+v", got, err, c)
	}
}

// TestRecordLifetimes: a box's lifetime options and deadlines are stored,
// and a version 1 record written before them (no such fields) loads as a
// box without limits.
func TestRecordLifetimes(t *testing.T) {
	now := time.UnixMilli(time.Now().UnixMilli())
	c := boxConfig{Options: BoxOptions{Image: "a", Network: NetworkNone, TTL: time.Hour, IdleTimeout: 90 * time.Second, Lease: 1500 * time.Millisecond},
		Meta: boxopts.Meta{ExpiresAt: now.Add(time.Hour), LeaseUntil: now.Add(1500 * time.Millisecond), LastUse: now}}
	raw := encodeConfig(c)
	for _, f := range []string{`"ttl_ms":3600000`, `"idle_timeout_ms":90000`, `"lease_ms":1500`, `"expires_at_ms":`, `"lease_until_ms":`, `"last_use_ms":`} {
		if !strings.Contains(string(raw), f) {
			t.Errorf("stored form lacks %s: %s", f, raw)
		}
	}
	got, err := decodeConfig(&store.Box{ID: "x", Config: raw})
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("round trip:\n got %+v %v\nwant %+v", got, err, c)
	}
	if d := got.idleDeadline(); !d.Equal(now.Add(90 * time.Second)) {
		t.Errorf("idle deadline %v", d)
	}
	// A sub-millisecond limit stays a limit.
	if got, _ := decodeConfig(&store.Box{ID: "x", Config: encodeConfig(boxConfig{Options: BoxOptions{Network: NetworkNone, TTL: time.Microsecond}})}); got.Options.TTL != time.Millisecond {
		t.Errorf("1us ttl stored as %v", got.Options.TTL)
	}
	// The longest limits stay the longest, not negative ones.
	long := boxConfig{Options: BoxOptions{Network: NetworkNone, TTL: math.MaxInt64, IdleTimeout: math.MaxInt64, Lease: math.MaxInt64}}
	long.Meta.StartLife(long.Options.plain(), now, bootTimeout)
	if got, err := decodeConfig(&store.Box{ID: "x", Config: encodeConfig(long)}); err != nil || got.Options.TTL != math.MaxInt64 ||
		got.Options.Lease != math.MaxInt64 || got.reapReason(now.Add(100*365*24*time.Hour), now) != "" {
		t.Errorf("longest limits: %+v %v", got, err)
	}
	// What the previous version wrote: no lifetime fields.
	old := `{"v":1,"image":"a","cpus":1,"memory_mib":512,"disk_mib":4096,"network":"none","image_config":{}}`
	got, err = decodeConfig(&store.Box{ID: "x", Config: []byte(old)})
	if err != nil || got.hasLife() || !got.ExpiresAt.IsZero() || !got.LeaseUntil.IsZero() || !got.LastUse.IsZero() || !got.idleDeadline().IsZero() {
		t.Fatalf("previous version's record: %+v %v", got, err)
	}
	if why := got.reapReason(time.Now().Add(1000*time.Hour), time.Time{}); why != "" {
		t.Errorf("a box without limits reaped for %q", why)
	}
}

func TestRecordV0(t *testing.T) {
	v0 := `{"options":{"Image":"a","Name":"","CPUs":1,"MemoryMiB":512,"DiskSizeMiB":4096,"Env":null,"WorkingDir":"","User":"","AutoRemove":true,"Network":"disabled"},"image":{"Env":["X=1"],"WorkingDir":"","User":"","Entrypoint":null,"Cmd":["sh"],"Labels":null},"owner_pid":5}`
	c, err := decodeConfig(&store.Box{ID: "x", Config: []byte(v0)})
	if err != nil {
		t.Fatal(err)
	}
	if c.Options.Network != NetworkNone || !c.Options.AutoRemove || c.OwnerPID != 5 || c.Image.Cmd[0] != "sh" || c.Options.MemoryMiB != 512 {
		t.Fatalf("%+v", c)
	}
	up, err := upgradeConfig([]byte(v0))
	if err != nil || !strings.Contains(string(up), `"network":"none"`) || !strings.Contains(string(up), `"v":1`) {
		t.Fatalf("upgraded: %s %v", up, err)
	}
	if c, _ := decodeConfig(&store.Box{ID: "x", Config: []byte(`{"options":{"Network":"enabled"}}`)}); c.Options.Network != NetworkPublic {
		t.Fatalf("enabled: %+v", c.Options)
	}
	// Records the network branch stored before versions carry its policy.
	v0net := `{"options":{"Image":"a","Network":"allowlist","AllowNet":["pypi.org"],"AllowHostPorts":[8080],"Ports":[{"host_port":80,"guest_port":8000,"protocol":"tcp"}]}}`
	c, err = decodeConfig(&store.Box{ID: "x", Config: []byte(v0net)})
	want := BoxOptions{Image: "a", Network: NetworkAllowlist, AllowNet: []string{"pypi.org"}, AllowHostPorts: []int{8080},
		Ports: []PortMapping{{HostPort: 80, GuestPort: 8000, Protocol: "tcp"}}}
	if err != nil || !reflect.DeepEqual(c.Options, want) {
		t.Fatalf("network policy of a version 0 record: %+v %v", c.Options, err)
	}
}

// TestRecordKeepsEveryOption: a BoxOptions field missing from boxrecord.Record
// would be dropped when the box is stored; this fills every field.
func TestRecordKeepsEveryOption(t *testing.T) {
	var o BoxOptions
	fill(t, reflect.ValueOf(&o).Elem(), "f")
	o.Network = NetworkAllowlist // one of the modes
	c := boxConfig{Options: o}
	raw := encodeConfig(c)
	// A secret's value is never in a record (it is in the box directory's
	// secrets file): the rest of it is.
	for k, s := range o.Secrets {
		if strings.Contains(string(raw), s.Value) {
			t.Errorf("the record holds secret %s's value: %s", k, raw)
		}
		s.Value = ""
		o.Secrets[k] = s
	}
	got, err := decodeConfig(&store.Box{ID: "x", Config: raw})
	if err != nil || !reflect.DeepEqual(got.Options, o) {
		t.Fatalf("stored and read back:\n got %+v %v\nwant %+v", got.Options, err, o)
	}
}

// fill sets v and everything in it to non-zero values.
func fill(t *testing.T, v reflect.Value, name string) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("v-" + name)
	case reflect.Int, reflect.Int64:
		n := int64(len(name))
		if v.Type() == reflect.TypeOf(time.Duration(0)) {
			n *= int64(time.Millisecond) // durations are stored in ms
		}
		v.SetInt(n)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(t, v.Index(0), name+"0")
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, name+"k")
		fill(t, e, name+"e")
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			fill(t, v.Field(i), name+v.Type().Field(i).Name)
		}
	default:
		t.Fatalf("fill: field %s of kind %s: extend fill", name, v.Kind())
	}
}

func TestRecordErrors(t *testing.T) {
	for _, raw := range []string{`{"v":99}`, `{"v":1,"network":"sideways"}`, `not json`} {
		_, err := decodeConfig(&store.Box{ID: "0123", Config: []byte(raw)})
		if err == nil || !strings.Contains(err.Error(), "box 0123") {
			t.Errorf("%s: %v", raw, err)
		}
	}
}
