package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
)

// TestEventsBacklogMarksWhatItDropped: a stream that asks for events no
// longer in the backlog gets one events.dropped saying how many, then the
// oldest kept, in order.
func TestEventsBacklogMarksWhatItDropped(t *testing.T) {
	e := NewEvents()
	const n = EventBacklog + 500
	for i := 0; i < n; i++ {
		e.BoxEvent(airlock.Event{Type: airlock.EventBoxPaused, BoxID: "b"})
	}
	evs, wake := e.after(0, EventBacklog+10)
	if wake != nil || len(evs) != 1+EventBacklog {
		t.Fatalf("%d events, want %d", len(evs), 1+EventBacklog)
	}
	if d := evs[0]; d.Type != EventEventsDropped || d.Dropped != 500 || d.Seq != 500 || !strings.Contains(d.Reason, "1..500") {
		t.Errorf("first %+v, want events.dropped of 500 (1..500)", d)
	}
	for i, ev := range evs[1:] {
		if ev.Seq != uint64(501+i) {
			t.Fatalf("event %d has seq %d, want %d", i, ev.Seq, 501+i)
		}
	}
	if evs, wake := e.after(n, 10); len(evs) != 0 || wake == nil {
		t.Errorf("after the last: %d events, wake %v; want none and a channel", len(evs), wake)
	}
	long := strings.Repeat("x", 3000)
	e.BoxEvent(airlock.Event{Type: airlock.EventExecStarted, Cmd: []string{"sh", "-c", long}})
	evs, _ = e.after(n, 10)
	if c := evs[0].Cmd; len(c) != 3 || len(c[2]) > maxEventCmd || !strings.HasSuffix(c[2], "…") {
		t.Errorf("a 3000-byte argv kept as %d args, last %d bytes", len(c), len(c[len(c)-1]))
	}
}

// TestEventsSlowSubscriber: a stream that does not read while tens of
// thousands of events are published neither blocks the publisher nor
// loses events unmarked: once it reads, its seqs rise, and every gap is
// one events.dropped whose seq is the gap's last and dropped its size;
// it ends at the last event.
func TestEventsSlowSubscriber(t *testing.T) {
	e := NewEvents()
	s := New(Config{Runtime: openRuntime(t), Events: e})
	ts := httptest.NewServer(s.Handler(false))
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 1<<16)
	next := func() Event {
		t.Helper()
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			if data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
				var ev Event
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					t.Fatal(err)
				}
				return ev
			}
		}
	}
	if ev := next(); ev.Type != EventStreamOpen {
		t.Fatalf("first %+v", ev)
	}
	// ~1 KiB each: far more than the socket buffers hold.
	const n = 40000
	arg := strings.Repeat("y", 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < n; i++ {
			e.BoxEvent(airlock.Event{Type: airlock.EventExecStarted, BoxID: "b", Cmd: []string{arg}})
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("publishing blocked behind a stream that does not read")
	}
	var last uint64
	dropped := 0
	deadline := time.Now().Add(60 * time.Second)
	for last < n && time.Now().Before(deadline) {
		ev := next()
		switch {
		case ev.Type == EventEventsDropped:
			if ev.Seq != last+ev.Dropped || ev.Dropped == 0 {
				t.Fatalf("after seq %d: %+v, want the gap's last seq and its size", last, ev)
			}
			dropped++
		case ev.Seq != last+1:
			t.Fatalf("after seq %d came %d (%s) unmarked", last, ev.Seq, ev.Type)
		}
		last = ev.Seq
	}
	if last != n {
		t.Fatalf("stream reached seq %d, want %d", last, n)
	}
	if dropped == 0 {
		t.Errorf("no events.dropped for a stream %d events behind (backlog %d)", n, EventBacklog)
	}
}
