package pool

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/capacity"
)

// refusal is a caller's public error for a start past a cap.
type refusal struct{ e *capacity.Exceeded }

func (r refusal) Error() string { return r.e.Error() }

// testCaps are 3 boxes and 3 boxes' worth of memory (512 MiB guests),
// with machines running and users boxes of the home.
func testCaps(machines, users, homeLimit int) *Caps {
	return &Caps{
		Limits: func() capacity.Limits { return capacity.Limits{Boxes: 3, MemoryMiB: 3 * capacity.HostMiB(512)} },
		Usage: func(string) *capacity.Usage {
			return &capacity.Usage{Machines: machines, MemoryMiB: machines * 512}
		},
		HomeLimit: homeLimit,
		HomeBoxes: func(context.Context, string) (int, error) { return users, nil },
		Refuse:    func(e *capacity.Exceeded) error { return refusal{e} },
		Refused:   func(err error) bool { return errors.As(err, new(refusal)) },
	}
}

func TestCapsFill(t *testing.T) {
	ctx := context.Background()
	if why := testCaps(2, 0, 0).Fill(ctx, 512, Counts{}); why != "" {
		t.Errorf("2 of 3 running, no fill: held back: %s", why)
	}
	if why := testCaps(2, 0, 0).Fill(ctx, 512, Counts{Filling: 1, FillingMiB: 512}); !strings.Contains(why, "3 running boxes") {
		t.Errorf("2 running and 1 filling of 3: %q, want the box cap", why)
	}
	if why := testCaps(0, 2, 3).Fill(ctx, 512, Counts{Held: 1}); !strings.Contains(why, "home's limit of 3") {
		t.Errorf("2 boxes and 1 pool box of a home of 3: %q, want the home's limit", why)
	}
	c := testCaps(0, 0, 3)
	c.HomeBoxes = func(context.Context, string) (int, error) { return 0, errors.New("store closed") }
	if why := c.Fill(ctx, 512, Counts{}); !strings.Contains(why, "store closed") {
		t.Errorf("home not counted: %q, want the store's error", why)
	}
}

func TestCapsEvictAndStart(t *testing.T) {
	ctx := context.Background()
	if testCaps(2, 0, 0).Evict(ctx, "b", 512, Counts{}) {
		t.Error("2 of 3 running: evicts")
	}
	if !testCaps(2, 0, 0).Evict(ctx, "b", 512, Counts{Starting: 1, StartingMiB: 512}) {
		t.Error("2 running and 1 starting of 3: does not evict")
	}
	if !testCaps(0, 2, 3).Evict(ctx, "b", 512, Counts{Held: 1}) {
		t.Error("home of 3 full with a pool box: does not evict")
	}
	c := testCaps(2, 0, 0)
	if err := c.Start("b", 512, Counts{}); err != nil {
		t.Errorf("2 of 3 running: %v", err)
	}
	err := c.Start("b", 512, Counts{Starting: 1, StartingMiB: 512})
	var r refusal
	if !errors.As(err, &r) || r.e.Cap != capacity.CapBoxes || !c.Full(err) {
		t.Errorf("2 running and 1 starting of 3: %v, want the box cap as the caller's error", err)
	}
	if err := c.Check("b", 4*capacity.HostMiB(512), 0, 0); !c.Full(err) || !errors.As(err, &r) || r.e.Cap != capacity.CapMemory {
		t.Errorf("a box larger than the memory cap: %v", err)
	}
	if c.Full(errors.New("boot failed")) {
		t.Error("a boot failure taken for a full host")
	}
}
