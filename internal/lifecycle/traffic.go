package lifecycle

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-run/airlock/internal/boundedio"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/netstack/helper"
)

// Traffic is, by box, the network counters a box's helper had when a
// reaper pass last found the box idle: traffic since counts as use. The
// counters are kept in the box's directory too (trafficFile), so that the
// next process's pass (each airlock command runs one) compares with them:
// kept in memory only, every new command counted all the traffic since
// the box's boot as use, and a box that ever had traffic never went idle
// without a server. Not safe for concurrent use (the reaper's passes are
// serialised); the zero value is ready.
type Traffic struct {
	m map[string]mark
}

// mark is a box's network helper and the sum of its counters.
type mark struct {
	PID int    `json:"pid"`
	Sum uint64 `json:"sum"`
}

// trafficFile is the name, in a box's directory, of the counters its
// helper had when a pass last looked.
const trafficFile = "idle-traffic.json"

// readMark returns the counters recorded in dir, if any.
func readMark(dir string) (mark, bool) {
	var m mark
	raw, err := boundedio.ReadFile(filepath.Join(dir, trafficFile), 4<<10)
	if err != nil || json.Unmarshal(raw, &m) != nil {
		return m, false
	}
	return m, true
}

// writeMark records m in dir (a temporary file renamed over the old):
// best effort, a pass without it counts from the helper's start.
func writeMark(dir string, m mark) {
	raw, _ := json.Marshal(m)
	tmp := filepath.Join(dir, trafficFile+".tmp")
	if os.WriteFile(tmp, raw, 0o600) == nil {
		os.Rename(tmp, filepath.Join(dir, trafficFile))
	}
}

// Used reports whether the network of box b carried traffic (bytes,
// flows, DNS queries) since the last call for it, in this process or
// another (the box directory's record), and records its counters. A
// network helper seen for the first time counts from its start, when its
// counters were 0. A box without a helper, or whose helper does not
// answer within 5 s, has carried none.
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
	cur := mark{PID: pid, Sum: st.BytesIn + st.BytesOut + st.Connections + st.DNSQueries}
	if t.m == nil {
		t.m = map[string]mark{}
	}
	last, seen := readMark(b.Dir)
	if !seen {
		last, seen = t.m[b.ID]
	}
	t.m[b.ID] = cur
	if !seen || last.PID != pid {
		last = mark{PID: pid}
	}
	if cur != last || !seen {
		writeMark(b.Dir, cur)
	}
	return cur.Sum != last.Sum
}

// Forget drops what is recorded of box id (it stopped, or was acted on).
func (t *Traffic) Forget(id string) { delete(t.m, id) }
