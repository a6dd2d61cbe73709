package airlock

import (
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/store"
)

func TestRecordRoundTrip(t *testing.T) {
	c := boxConfig{
		Options: BoxOptions{Image: "python:slim", Name: "n", CPUs: 2, MemoryMiB: 300, DiskSizeMiB: 100, Env: []string{"A=1"},
			WorkingDir: "/w", User: "u", AutoRemove: true, Network: NetworkDisabled},
		Image:    image.ImageConfig{Env: []string{"PATH=/bin"}, WorkingDir: "/x", User: "1", Entrypoint: []string{"e"}, Cmd: []string{"c"}, Labels: map[string]string{"k": "v"}},
		OwnerPID: 7, OwnerStart: 9,
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

func TestRecordV0(t *testing.T) {
	v0 := `{"options":{"Image":"a","Name":"","CPUs":1,"MemoryMiB":512,"DiskSizeMiB":4096,"Env":null,"WorkingDir":"","User":"","AutoRemove":true,"Network":"disabled"},"image":{"Env":["X=1"],"WorkingDir":"","User":"","Entrypoint":null,"Cmd":["sh"],"Labels":null},"owner_pid":5}`
	c, err := decodeConfig(&store.Box{ID: "x", Config: []byte(v0)})
	if err != nil {
		t.Fatal(err)
	}
	if c.Options.Network != NetworkDisabled || !c.Options.AutoRemove || c.OwnerPID != 5 || c.Image.Cmd[0] != "sh" || c.Options.MemoryMiB != 512 {
		t.Fatalf("%+v", c)
	}
	up, err := upgradeConfig([]byte(v0))
	if err != nil || !strings.Contains(string(up), `"network":"none"`) || !strings.Contains(string(up), `"v":1`) {
		t.Fatalf("upgraded: %s %v", up, err)
	}
	if c, _ := decodeConfig(&store.Box{ID: "x", Config: []byte(`{"options":{"Network":"enabled"}}`)}); c.Options.Network != NetworkEnabled {
		t.Fatalf("enabled: %+v", c.Options)
	}
}

func TestRecordErrors(t *testing.T) {
	for _, raw := range []string{`{"v":99}`, `{"v":1,"network":"sideways"}`, `not json`} {
		_, err := decodeConfig(&store.Box{ID: "0123", Config: []byte(raw)})
		if err == nil || !strings.Contains(err.Error(), "box 0123") {
			t.Errorf("%s: %v", raw, err)
		}
	}
	if _, err := decodeRecord([]byte(`{"v":99}`)); err == nil || !strings.Contains(err.Error(), "upgrade airlock") {
		t.Errorf("newer version: %v", err)
	}
}
