package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/airlock-run/airlock/internal/kubebox"
	"github.com/airlock-run/airlock/internal/server"
)

// The gateway's event stream (/v1/events) is its own: it follows the
// event stream of every node that serves an airlock API and passes on the
// events of the boxes it made (their node boxes carry the pods' labels),
// with the gateway's box ids, numbered by the gateway's server. Two
// gateways number them apart: a stream resumes (since=SEQ) on the gateway
// that numbered it. Events a node's stream missed while the gateway was
// not connected to it are one events.dropped naming the node.

var _ server.ClusterEvents = (*Gateway)(nil)

// Bounds of the node event streams.
const (
	// nodeEventsResync is how often the nodes to follow are listed.
	nodeEventsResync = 5 * time.Second
	// maxEventLine bounds one line of a node's event stream.
	maxEventLine = 1 << 20
	// maxEventRetry is the longest wait before following a node again.
	maxEventRetry = 5 * time.Second
)

// RunEvents implements server.ClusterEvents: it follows every node's
// event stream until ctx ends.
func (g *Gateway) RunEvents(ctx context.Context, publish func(server.Event, map[string]string)) {
	following := map[string]context.CancelFunc{}
	defer func() {
		for _, c := range following {
			c()
		}
	}()
	for {
		nodes, err := g.nodes.List(labels.Everything())
		if err == nil {
			seen := map[string]bool{}
			for _, n := range nodes {
				if n.Annotations[kubebox.APIAnnotation] == "" {
					continue
				}
				seen[n.Name] = true
				if _, ok := following[n.Name]; !ok {
					nctx, cancel := context.WithCancel(ctx)
					following[n.Name] = cancel
					go g.followNode(nctx, n.Name, publish)
				}
			}
			for name, cancel := range following {
				if !seen[name] {
					cancel()
					delete(following, name)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(nodeEventsResync):
		}
	}
}

// nodeBoxes maps a node's box ids to the gateway's boxes.
type nodeBoxes struct {
	mu     sync.Mutex
	boxes  map[string]server.Box // by the node's box id: ID the gateway's, Labels the box's
	missed map[string]bool       // node box ids that are not the gateway's
}

// followNode passes on node name's events until ctx ends, connecting
// again (since the last event seen) when its stream breaks.
func (g *Gateway) followNode(ctx context.Context, name string, publish func(server.Event, map[string]string)) {
	nb := &nodeBoxes{boxes: map[string]server.Box{}, missed: map[string]bool{}}
	var since uint64
	wait := 500 * time.Millisecond
	for ctx.Err() == nil {
		st, err := g.node(ctx, name, false)
		if err == nil && st.api != "" && st.lost == "" {
			g.refreshBoxes(ctx, st, nb)
			var got bool
			since, got, err = g.streamNode(ctx, st, since, nb, publish)
			if got {
				wait = 500 * time.Millisecond
			}
			if err != nil && ctx.Err() == nil {
				g.cfg.Logf("events of node %s: %v", name, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, maxEventRetry)
	}
}

// refreshBoxes lists node st's boxes into nb.
func (g *Gateway) refreshBoxes(ctx context.Context, st nodeState, nb *nodeBoxes) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var list server.BoxList
	if err := g.nodeCall(ctx, st, http.MethodGet, "/v1/boxes", nil, &list); err != nil {
		return
	}
	nb.mu.Lock()
	defer nb.mu.Unlock()
	clear(nb.missed)
	for _, b := range list.Boxes {
		if id := b.Labels[kubebox.IDLabel]; id != "" {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: b.Labels}}
			nb.boxes[b.ID] = server.Box{ID: id, Labels: boxLabels(p)}
		}
	}
}

// lookup maps node box id to the gateway's box, listing the node's boxes
// once when it is not known yet.
func (g *Gateway) lookup(ctx context.Context, st nodeState, nb *nodeBoxes, id string) (server.Box, bool) {
	nb.mu.Lock()
	b, ok := nb.boxes[id]
	missed := nb.missed[id]
	nb.mu.Unlock()
	if ok || missed {
		return b, ok
	}
	g.refreshBoxes(ctx, st, nb)
	nb.mu.Lock()
	defer nb.mu.Unlock()
	b, ok = nb.boxes[id]
	if !ok && len(nb.missed) < 1<<14 {
		nb.missed[id] = true
	}
	return b, ok
}

// streamNode reads node st's event stream from since (0: from now) and
// publishes the events of the gateway's boxes; it returns the last seq
// read, whether any event came, and why the stream ended.
func (g *Gateway) streamNode(ctx context.Context, st nodeState, since uint64, nb *nodeBoxes, publish func(server.Event, map[string]string)) (uint64, bool, error) {
	u := st.api + "/v1/events"
	if since > 0 {
		u += "?since=" + strconv.FormatUint(since, 10)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return since, false, err
	}
	req.Header.Set("Authorization", "Bearer "+g.cfg.NodeToken)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := (&http.Client{Transport: g.transport}).Do(req) // no timeout: a stream
	if err != nil {
		return since, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return since, false, fmt.Errorf("GET /v1/events: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxEventLine)
	got := false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		var ev server.Event
		if json.Unmarshal(bytes.TrimSpace(data), &ev) != nil {
			continue
		}
		got = true
		switch ev.Type {
		case server.EventStreamOpen:
			if since == 0 {
				since = ev.Seq
			}
			continue
		case server.EventEventsDropped:
			since = max(since, ev.Seq)
			publish(server.Event{Type: ev.Type, Time: ev.Time, Dropped: ev.Dropped,
				Reason: fmt.Sprintf("node %s: %s", st.name, ev.Reason)}, nil)
			continue
		}
		since = max(since, ev.Seq)
		if ev.BoxID == "" {
			continue
		}
		b, ok := g.lookup(ctx, st, nb, ev.BoxID)
		if !ok {
			continue // a box the gateway did not make
		}
		if ev.Type == server.EventBoxRemoved {
			nb.mu.Lock()
			delete(nb.boxes, ev.BoxID)
			nb.mu.Unlock()
		}
		ev.BoxID, ev.Children = b.ID, nil
		publish(ev, b.Labels)
	}
	if err := sc.Err(); err != nil {
		return since, got, err
	}
	return since, got, fmt.Errorf("the stream ended")
}
