package server

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/sse"

	"github.com/airlock-run/airlock"
)

// Event types of /v1/events: the library's (airlock.EventType), and two
// of the stream's own.
const (
	EventBoxCreated      = string(airlock.EventBoxCreated)
	EventBoxStarted      = string(airlock.EventBoxStarted)
	EventBoxStartFailed  = string(airlock.EventBoxStartFailed)
	EventBoxPaused       = string(airlock.EventBoxPaused)
	EventBoxResumed      = string(airlock.EventBoxResumed)
	EventBoxSuspended    = string(airlock.EventBoxSuspended)
	EventBoxSnapshotted  = string(airlock.EventBoxSnapshotted)
	EventBoxForked       = string(airlock.EventBoxForked)
	EventBoxCheckpointed = string(airlock.EventBoxCheckpointed)
	EventBoxRolledBack   = string(airlock.EventBoxRolledBack)
	EventBoxStopped      = string(airlock.EventBoxStopped)
	EventBoxRemoved      = string(airlock.EventBoxRemoved)
	EventBoxDied         = string(airlock.EventBoxDied)
	EventExecStarted     = string(airlock.EventExecStarted)
	EventExecEnded       = string(airlock.EventExecEnded)
	// EventStreamOpen is the first message of every stream; its seq is
	// the last event's before the stream's first (0: none yet).
	EventStreamOpen = "stream.open"
	// EventEventsDropped stands where events were lost to this stream:
	// Dropped of them, up to and including Seq (the backlog of
	// EventBacklog no longer held them, or the server restarted).
	EventEventsDropped = "events.dropped"
)

// Event is one message of the event stream.
type Event struct {
	Seq   uint64    `json:"seq" doc:"Number of the event in this server's life: 1, 2, 3... with no gaps; an events.dropped stands for those a stream missed. Resume a stream with ?since=SEQ (or the Last-Event-ID header, which EventSource sends by itself)."`
	Time  time.Time `json:"time"`
	Type  string    `json:"type" enum:"stream.open,events.dropped,box.created,box.started,box.start_failed,box.paused,box.resumed,box.suspended,box.snapshotted,box.forked,box.checkpointed,box.rolled_back,box.stopped,box.removed,box.died,exec.started,exec.ended"`
	BoxID string    `json:"box_id,omitempty"`
	// Reason: why a box was removed (removed, auto_remove, start_failed,
	// fork_failed, ttl, idle_timeout, lease_expired), why its VM died, why
	// a start failed, why events were dropped.
	Reason     string   `json:"reason,omitempty"`
	Snapshot   string   `json:"snapshot,omitempty" doc:"box.snapshotted: the snapshot's name; box.checkpointed: the checkpoint's."`
	Children   []string `json:"children,omitempty" doc:"box.forked: the new boxes' ids."`
	ExecID     uint64   `json:"exec_id,omitempty" doc:"exec.started and exec.ended: the same number for one exec."`
	Cmd        []string `json:"cmd,omitempty" doc:"exec.started: the argv (at most 1 KiB of it; longer is cut, with an ellipsis)."`
	ExitCode   *int     `json:"exit_code,omitempty" doc:"exec.ended: the exit status (absent when the exec failed)."`
	TimedOut   bool     `json:"timed_out,omitempty"`
	Error      string   `json:"error,omitempty" doc:"exec.ended: why the exec could not be carried out."`
	DurationMS float64  `json:"duration_ms,omitempty"`
	Dropped    uint64   `json:"dropped,omitempty" doc:"events.dropped: how many events this stream missed."`
}

// EventBacklog is how many of the latest events the server keeps for
// streams that lag or resume (?since=): a stream that falls further behind
// gets an events.dropped in place of what it missed, and goes on.
const EventBacklog = 1024

// maxEventCmd bounds the argv bytes an exec.started keeps.
const maxEventCmd = 1024

// Events is the server's event bus: the library's events (it is an
// airlock.EventObserver), numbered in the order they come, the latest
// EventBacklog of them kept for streams to read at their own pace. A nil
// *Events drops everything.
type Events struct {
	mu      sync.Mutex
	seq     uint64 // the last event's
	ring    []Event
	changed chan struct{} // closed at the next publish
}

// NewEvents returns an empty bus.
func NewEvents() *Events {
	return &Events{ring: make([]Event, EventBacklog), changed: make(chan struct{})}
}

func (e *Events) publish(ev Event) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	ev.Seq = e.seq
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	e.ring[e.seq%uint64(len(e.ring))] = ev
	close(e.changed)
	e.changed = make(chan struct{})
}

// last returns the last event's seq.
func (e *Events) last() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq
}

// after returns up to max events following seq since, in order; when
// some of them are no longer kept (or since is past the last event: the
// server restarted), an events.dropped first stands for them. With
// nothing new, it returns a channel closed at the next event.
func (e *Events) after(since uint64, max int) ([]Event, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Event
	n := uint64(len(e.ring))
	oldest := uint64(1)
	if e.seq > n {
		oldest = e.seq - n + 1
	}
	switch {
	case since > e.seq:
		// Not this server's: it started over.
		out = append(out, Event{Type: EventEventsDropped, Time: time.Now().UTC(), Seq: 0, Dropped: 0,
			Reason: fmt.Sprintf("seq %d is past this server's last event (%d): the server restarted, and what happened between is not known", since, e.seq)})
		since = 0
	case since+1 < oldest:
		out = append(out, Event{Type: EventEventsDropped, Time: time.Now().UTC(), Seq: oldest - 1, Dropped: oldest - 1 - since,
			Reason: fmt.Sprintf("events %d..%d are past the server's backlog of %d", since+1, oldest-1, n)})
		since = oldest - 1
	}
	for s := since + 1; s <= e.seq && len(out) < max; s++ {
		out = append(out, e.ring[s%n])
	}
	if len(out) == 0 {
		return nil, e.changed
	}
	return out, nil
}

// BoxEvent implements airlock.EventObserver.
func (e *Events) BoxEvent(ev airlock.Event) {
	out := Event{Type: string(ev.Type), BoxID: ev.BoxID, Time: ev.Time.UTC(), Reason: ev.Reason,
		Snapshot: ev.Snapshot, Children: ev.Children, ExecID: ev.ExecID, DurationMS: ms(ev.Duration)}
	switch ev.Type {
	case airlock.EventExecStarted:
		out.Cmd = capCmd(ev.Cmd)
	case airlock.EventExecEnded:
		out.TimedOut = ev.TimedOut
		if ev.Err != nil {
			out.Error = ev.Err.Error()
		} else {
			code := ev.ExitCode
			out.ExitCode = &code
		}
	}
	e.publish(out)
}

// capCmd keeps at most maxEventCmd bytes of argv, marking a cut with "…".
func capCmd(argv []string) []string {
	out := make([]string, 0, len(argv))
	left := maxEventCmd
	for _, a := range argv {
		if len(a) > left {
			out = append(out, strings.ToValidUTF8(a[:left], "")+"…")
			break
		}
		out = append(out, a)
		left -= len(a)
	}
	return out
}

// BoxStarted implements airlock.Observer (BoxEvent has it).
func (e *Events) BoxStarted(airlock.BoxStartEvent) {}

// ExecEnded implements airlock.Observer (BoxEvent has it).
func (e *Events) ExecEnded(airlock.ExecEvent) {}

// BoxDied implements airlock.Observer (BoxEvent has it).
func (e *Events) BoxDied(airlock.BoxDiedEvent) {}

// ImagePulled implements airlock.Observer (no event).
func (e *Events) ImagePulled(airlock.ImagePullEvent) {}

// Observers fans library events out to several observers (metrics and
// events).
type Observers []airlock.Observer

// BoxStarted implements airlock.Observer.
func (o Observers) BoxStarted(e airlock.BoxStartEvent) {
	for _, x := range o {
		x.BoxStarted(e)
	}
}

// ExecEnded implements airlock.Observer.
func (o Observers) ExecEnded(e airlock.ExecEvent) {
	for _, x := range o {
		x.ExecEnded(e)
	}
}

// BoxDied implements airlock.Observer.
func (o Observers) BoxDied(e airlock.BoxDiedEvent) {
	for _, x := range o {
		x.BoxDied(e)
	}
}

// ImagePulled implements airlock.Observer.
func (o Observers) ImagePulled(e airlock.ImagePullEvent) {
	for _, x := range o {
		x.ImagePulled(e)
	}
}

// BoxEvent implements airlock.EventObserver, for those of o that are.
func (o Observers) BoxEvent(e airlock.Event) {
	for _, x := range o {
		if eo, ok := x.(airlock.EventObserver); ok {
			eo.BoxEvent(e)
		}
	}
}

// eventsInput is where a stream starts.
type eventsInput struct {
	Since       string `query:"since" maxLength:"20" pattern:"^[0-9]+$" doc:"Resume after this seq: the events that followed it (those still in the backlog of 1024; an events.dropped stands for older ones). 0: all the backlog. Absent: only new events."`
	LastEventID string `header:"Last-Event-ID" maxLength:"20" pattern:"^[0-9]*$" doc:"As since (EventSource sends it when it reconnects); since wins."`
}

// eventsBatch bounds the events a stream takes from the bus at once.
const eventsBatch = 256

func (s *Server) registerEvents() {
	sse.Register(s.api, huma.Operation{
		OperationID: "events", Method: http.MethodGet, Path: "/v1/events", Tags: []string{"server"},
		Summary: "Stream events (Server-Sent Events)",
		Description: "Every transition of the server's boxes, in the order they happened, one SSE `message` per event (JSON, with an `id:` " +
			"that is its seq): box created, started, start_failed, paused, resumed, suspended, snapshotted, forked, checkpointed, rolled_back, stopped, removed, died; " +
			"exec started and ended (every process started in the box: execs, code runs, a context's kernel and the helpers it runs; one exec_id for both). seq counts 1, 2, 3... in the server's life. " +
			"The first message is stream.open, its seq the last event's. A stream resumes with ?since=SEQ or Last-Event-ID: the server keeps the " +
			"last 1024 events; a stream that asks for older ones, or falls further behind, gets one events.dropped (dropped: how many, seq: the last " +
			"of them) and goes on from the oldest kept: nothing is lost unmarked. A since past the last event (the server restarted) gets an " +
			"events.dropped and the whole backlog. Events of boxes changed by another process (the CLI) are not seen. " +
			"A client that does not read for 30 s (airlock serve --write-stall) is disconnected; " +
			"past the server's limit of open streams (--max-subscribers, 64 by default) a new one gets 503 too_many_subscribers.",
		Errors: []int{http.StatusBadRequest, http.StatusServiceUnavailable},
	}, map[string]any{"message": Event{}}, func(ctx context.Context, in *eventsInput, send sse.Sender) {
		if s.events == nil {
			return
		}
		cursor := s.events.last()
		from := in.Since
		if from == "" {
			from = in.LastEventID
		}
		if from != "" {
			n, err := strconv.ParseUint(from, 10, 64)
			if err != nil {
				// The stream has begun: the error is its one message.
				send.Data(Event{Type: EventEventsDropped, Time: time.Now().UTC(),
					Reason: fmt.Sprintf("since %q is not a seq (want a number from an earlier event): no events sent", from)})
				return
			}
			cursor = n
		}
		// A first message, so clients know they are subscribed.
		if err := send.Data(Event{Seq: min(cursor, s.events.last()), Type: EventStreamOpen, Time: time.Now().UTC()}); err != nil {
			return
		}
		for {
			evs, wake := s.events.after(cursor, eventsBatch)
			for _, ev := range evs {
				cursor = ev.Seq
				if ev.Type != EventEventsDropped && !s.eventVisible(ctx, ev) {
					continue // another tenant's box
				}
				if err := send(sse.Message{ID: int(ev.Seq), Data: ev}); err != nil {
					return
				}
			}
			if wake == nil {
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-s.shutdown:
				return
			case <-wake:
			}
		}
	})
}
