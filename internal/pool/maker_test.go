package pool

import (
	"context"
	"errors"
	"testing"
)

type makerBox struct{ id string }

func (b *makerBox) ID() string { return b.id }

// testMaker boots boxes named b1, b2, ... and records what it removed
// and snapshotted.
func testMaker(removed *[]string, snaps *[]string) *Maker[*makerBox] {
	n := 0
	return &Maker[*makerBox]{
		CanSnapshot: func() error { return nil },
		New: func(context.Context) (*makerBox, error) {
			n++
			return &makerBox{id: "b" + string(rune('0'+n))}, nil
		},
		TemplateName: func() string { return "pool-t" },
		Snapshot: func(_ context.Context, b *makerBox, name string) error {
			*snaps = append(*snaps, b.id+":"+name)
			return nil
		},
		NotSupported: errNotSupported,
		Delete: func(_ context.Context, b *makerBox) error {
			*removed = append(*removed, b.id)
			return nil
		},
	}
}

var errNotSupported = errors.New("not supported")

func TestMakerTemplate(t *testing.T) {
	ctx := context.Background()
	var removed, snaps []string
	m := testMaker(&removed, &snaps)
	prepared := ""
	m.Prepare = func(_ context.Context, b *makerBox) error { prepared = b.id; return nil }
	name, err := m.Template(ctx)
	if err != nil || name != "pool-t" {
		t.Fatalf("Template: %q, %v", name, err)
	}
	if prepared != "b1" || len(snaps) != 1 || snaps[0] != "b1:pool-t" || len(removed) != 1 || removed[0] != "b1" {
		t.Errorf("template box prepared %q, snapshots %v, removed %v: want b1 prepared, snapshotted as pool-t, removed", prepared, snaps, removed)
	}

	// No snapshots: ErrNoTemplate, from the driver's check or the snapshot.
	m.CanSnapshot = func() error { return errNotSupported }
	if _, err := m.Template(ctx); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("driver without snapshots: %v, want ErrNoTemplate", err)
	}
	m.CanSnapshot = func() error { return nil }
	m.Snapshot = func(context.Context, *makerBox, string) error { return errNotSupported }
	if _, err := m.Template(ctx); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("snapshot not supported: %v, want ErrNoTemplate", err)
	}
	m.Snapshot = func(context.Context, *makerBox, string) error { return errors.New("disk full") }
	if _, err := m.Template(ctx); err == nil || errors.Is(err, ErrNoTemplate) {
		t.Errorf("snapshot failed: %v, want a failure that is not ErrNoTemplate", err)
	}
	if len(removed) != 3 { // none booted where the driver cannot snapshot
		t.Errorf("removed %v: want every template box removed", removed)
	}
}

func TestMakerBootPrepareFails(t *testing.T) {
	var removed, snaps []string
	m := testMaker(&removed, &snaps)
	m.Prepare = func(context.Context, *makerBox) error { return errors.New("no python") }
	if b, err := m.Boot(context.Background()); err == nil || b != nil {
		t.Fatalf("Boot with a failing Prepare: %v, %v", b, err)
	}
	if len(removed) != 1 || removed[0] != "b1" {
		t.Errorf("removed %v: want the box Prepare failed in", removed)
	}
	if v, err := m.Warm(context.Background(), &makerBox{}); v != nil || err != nil {
		t.Errorf("Warm without WarmUp: %v, %v", v, err)
	}
}
