package pool

import (
	"context"
	"fmt"

	"github.com/airlock-run/airlock/internal/capacity"
)

// Caps is the Room of the root package's warm pools (docs/pool.md,
// "Caps"). A pool box is a running machine: it counts against the host
// caps (Options.MaxBoxes and Options.MaxMemoryMiB, which count the VM
// driver's machines host-wide) and against the home's budget for pools
// (Options.PoolMaxHomeBoxes, which `airlock serve --max-boxes` sets).
// With the Set's rules (the package comment), that gives:
//
//   - a fill is made only when there is room for it: the running machines,
//     the fills and the starts of this runtime in progress, plus one, fit
//     the caps; otherwise the pool is held back (Status.HeldBack) until
//     the next check (every second, and after each claim);
//   - a claim turns a pool box into the caller's box: counted once, before
//     and after;
//   - a box of this runtime that is not a pool box and would start past a
//     cap first takes the room of ready pool boxes: they are removed
//     (Status.Evicted), one at a time, from the pool with the most ready,
//     newest first, until it fits or none is left. Boxes being filled are
//     not stopped: a start past a cap with no ready pool box fails as it
//     would without pools (airlock.CapacityError);
//   - every start of this runtime (a user box's, a pool box's) checks the
//     host caps and holds its place until its machine runs (Set.Launch):
//     concurrent starts of one runtime cannot pass a cap together. Other
//     processes' starts are checked, not reserved.
//
// What is counted comes in as functions: Caps knows no driver and no box
// store.
type Caps struct {
	// Limits returns the host caps.
	Limits func() capacity.Limits
	// Usage counts the running machines other than box except's; nil when
	// they cannot be counted (only a box alone is then checked).
	Usage func(except string) *capacity.Usage
	// HomeLimit is the home's budget of boxes not stopped (0: none), and
	// HomeBoxes counts those of the home that are not pool boxes, other
	// than box except.
	HomeLimit int
	HomeBoxes func(ctx context.Context, except string) (int, error)
	// Refuse turns a start past a host cap into the error Start returns
	// (the caller's public error), and Refused recognises one.
	Refuse  func(*capacity.Exceeded) error
	Refused func(error) bool
}

// Fill says why one more pool box of memMiB does not fit the caps now
// ("" when it does).
func (c *Caps) Fill(ctx context.Context, memMiB int, n Counts) string {
	p := capacity.Pending{Filling: n.Filling, FillingMiB: n.FillingMiB, Starting: n.Starting, StartingMiB: n.StartingMiB}
	if why := c.Limits().Fill(c.Usage(""), p, memMiB); why != "" {
		return why
	}
	if c.HomeLimit > 0 {
		users, err := c.HomeBoxes(ctx, "")
		if err != nil {
			return fmt.Sprintf("cannot count the home's boxes: %v", err)
		}
		return capacity.HomeFill(c.HomeLimit, users, n.Held)
	}
	return ""
}

// Evict reports whether starting box id of memMiB passes a host cap that
// removing pool boxes could help with (counting the launches in
// progress), or the home's budget.
func (c *Caps) Evict(ctx context.Context, id string, memMiB int, n Counts) bool {
	if c.Limits().Evict(c.Usage(id), n.Starting, n.StartingMiB, memMiB) {
		return true
	}
	if c.HomeLimit <= 0 {
		return false
	}
	users, err := c.HomeBoxes(ctx, id)
	if err != nil {
		return false
	}
	return capacity.HomeFull(c.HomeLimit, users, n.Held)
}

// Start checks the host caps for box id of memMiB with the launches in
// progress.
func (c *Caps) Start(id string, memMiB int, n Counts) error {
	return c.Check(id, memMiB, n.Starting, n.StartingMiB)
}

// Check returns Refuse's error when box id of memMiB of guest memory
// would pass a host cap, with pending more machines of pendingMiB guest
// memory starting (not yet counted by Usage) besides; nil when it fits.
// Where Usage cannot count, only the memory cap of one box holds.
func (c *Caps) Check(id string, memMiB, pending, pendingMiB int) error {
	l := c.Limits()
	if e := l.Alone(memMiB); e != nil {
		return c.Refuse(e)
	}
	u := c.Usage(id)
	if u != nil {
		u.Machines += pending
		u.MemoryMiB += pendingMiB
	}
	if e := l.Start(u, memMiB); e != nil {
		return c.Refuse(e)
	}
	return nil
}

// Full reports whether err is a start refused at a host cap.
func (c *Caps) Full(err error) bool { return c.Refused(err) }
