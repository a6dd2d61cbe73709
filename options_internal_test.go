package airlock

import (
	"reflect"
	"testing"

	"github.com/airlock-run/airlock/internal/boxopts"
)

// TestBoxOptionConstants: the public defaults and bounds are the ones
// internal/boxopts fills in and checks.
func TestBoxOptionConstants(t *testing.T) {
	for _, c := range []struct {
		name      string
		pub, want any
	}{
		{"DefaultImage", DefaultImage, boxopts.DefaultImage}, {"DefaultCPUs", DefaultCPUs, boxopts.DefaultCPUs},
		{"DefaultMemoryMiB", DefaultMemoryMiB, boxopts.DefaultMemoryMiB}, {"DefaultDiskSizeMiB", DefaultDiskSizeMiB, boxopts.DefaultDiskSizeMiB},
		{"MaxCPUs", MaxCPUs, boxopts.MaxCPUs}, {"MinMemoryMiB", MinMemoryMiB, boxopts.MinMemoryMiB},
		{"MinDiskSizeMiB", MinDiskSizeMiB, boxopts.MinDiskSizeMiB},
		{"IdleRemove", string(IdleRemove), boxopts.IdleRemove}, {"IdleStop", string(IdleStop), boxopts.IdleStop},
		{"IdleSuspend", string(IdleSuspend), boxopts.IdleSuspend},
	} {
		if c.pub != c.want {
			t.Errorf("%s = %v, internal/boxopts has %v", c.name, c.pub, c.want)
		}
	}
}

// TestPlainOptionsRoundTrip: BoxOptions and boxopts.Options have the same
// fields, in the same order, and every one survives plain and public.
func TestPlainOptionsRoundTrip(t *testing.T) {
	pt, it := reflect.TypeOf(BoxOptions{}), reflect.TypeOf(boxopts.Options{})
	if pt.NumField() != it.NumField() {
		t.Fatalf("BoxOptions has %d fields, boxopts.Options %d", pt.NumField(), it.NumField())
	}
	for i := 0; i < pt.NumField(); i++ {
		if pt.Field(i).Name != it.Field(i).Name || pt.Field(i).Tag != it.Field(i).Tag {
			t.Errorf("field %d: BoxOptions.%s %q, boxopts.Options.%s %q", i, pt.Field(i).Name, pt.Field(i).Tag, it.Field(i).Name, it.Field(i).Tag)
		}
	}
	var o BoxOptions
	fill(t, reflect.ValueOf(&o).Elem(), "f")
	if got := public(o.plain()); !reflect.DeepEqual(got, o) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, o)
	}
}
