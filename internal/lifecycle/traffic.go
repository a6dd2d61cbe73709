package lifecycle

import (
	"context"
	"time"

	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/netstack/helper"
)

// Traffic is, by box, the network counters a box's helper had when a
// reaper pass last found the box idle: traffic since counts as use. Not
// safe for concurrent use (the reaper's passes are serialised); the zero
// value is ready.
type Traffic struct {
	m map[string]mark
}

// mark is a box's network helper and the sum of its counters.
type mark struct {
	pid int
	sum uint64
}

// Used reports whether the network of box b carried traffic (bytes,
// flows, DNS queries) since the last call for it, and records its
// counters. A network helper seen for the first time counts from its
// start, when its counters were 0. A box without a helper, or whose
// helper does not answer within 5 s, has carried none.
func (t *Traffic) Used(ctx context.Context, b helper.Box) bool {
	pid, ok := helper.PID(b.Dir)
	if !ok {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := helper.Call(cctx, b, netstack.Request{Op: "stats"})
	if err != nil {
		return false
	}
	st := resp.Stats
	cur := mark{pid: pid, sum: st.BytesIn + st.BytesOut + st.Connections + st.DNSQueries}
	if t.m == nil {
		t.m = map[string]mark{}
	}
	last, seen := t.m[b.ID]
	t.m[b.ID] = cur
	if !seen || last.pid != pid {
		last = mark{pid: pid}
	}
	return cur.sum != last.sum
}

// Forget drops what is recorded of box id (it stopped, or was acted on).
func (t *Traffic) Forget(id string) { delete(t.m, id) }
