package server

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/sse"

	"github.com/airlock-run/airlock"
)

// Event types of /v1/events.
const (
	EventBoxCreated     = "box.created"
	EventBoxStarted     = "box.started"
	EventBoxStartFailed = "box.start_failed"
	EventBoxStopped     = "box.stopped"
	EventBoxRemoved     = "box.removed"
	EventBoxDied        = "box.died"
	EventExecStarted    = "exec.started"
	EventExecEnded      = "exec.ended"
	// EventStreamOpen is the first message of every stream (seq 0).
	EventStreamOpen = "stream.open"
)

// Event is one message of the event stream.
type Event struct {
	Seq   uint64    `json:"seq" doc:"Increasing number of the event in this server's life."`
	Time  time.Time `json:"time"`
	Type  string    `json:"type" enum:"stream.open,box.created,box.started,box.start_failed,box.stopped,box.removed,box.died,exec.started,exec.ended"`
	BoxID string    `json:"box_id,omitempty"`
	// Reason: why a box was removed (removed, ttl, idle_timeout,
	// lease_expired), why its VM died, why a start failed.
	Reason     string   `json:"reason,omitempty"`
	Cmd        []string `json:"cmd,omitempty" doc:"exec.started: the argv."`
	ExitCode   *int     `json:"exit_code,omitempty" doc:"exec.ended: the exit status (absent when the exec failed)."`
	TimedOut   bool     `json:"timed_out,omitempty"`
	Error      string   `json:"error,omitempty" doc:"exec.ended: why the exec could not be carried out."`
	DurationMS float64  `json:"duration_ms,omitempty"`
}

// subscriberBuffer is how many events a slow /v1/events client may lag
// behind before it is disconnected.
const subscriberBuffer = 1024

// Events is the server's event bus. It implements airlock.Observer for the
// events the library sees (starts, execs that ended, VM deaths); the
// server adds the ones only it sees (created, stopped, removed, exec
// started). A nil *Events drops everything.
type Events struct {
	mu   sync.Mutex
	seq  uint64
	subs map[chan Event]struct{}
}

// NewEvents returns an empty bus.
func NewEvents() *Events { return &Events{subs: map[chan Event]struct{}{}} }

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
	for ch := range e.subs {
		select {
		case ch <- ev:
		default:
			// Too slow: cut it off rather than block the box's goroutine.
			delete(e.subs, ch)
			close(ch)
		}
	}
}

func (e *Events) subscribe() (<-chan Event, func()) {
	ch := make(chan Event, subscriberBuffer)
	e.mu.Lock()
	e.subs[ch] = struct{}{}
	e.mu.Unlock()
	return ch, func() {
		e.mu.Lock()
		if _, ok := e.subs[ch]; ok {
			delete(e.subs, ch)
			close(ch)
		}
		e.mu.Unlock()
	}
}

// BoxStarted implements airlock.Observer.
func (e *Events) BoxStarted(ev airlock.BoxStartEvent) {
	if ev.Err != nil {
		e.publish(Event{Type: EventBoxStartFailed, BoxID: ev.BoxID, Reason: ev.Err.Error(), DurationMS: ms(ev.Duration)})
		return
	}
	e.publish(Event{Type: EventBoxStarted, BoxID: ev.BoxID, DurationMS: ms(ev.Duration)})
}

// ExecEnded implements airlock.Observer.
func (e *Events) ExecEnded(ev airlock.ExecEvent) {
	out := Event{Type: EventExecEnded, BoxID: ev.BoxID, TimedOut: ev.TimedOut, DurationMS: ms(ev.Duration)}
	if ev.Err != nil {
		out.Error = ev.Err.Error()
	} else {
		code := ev.ExitCode
		out.ExitCode = &code
	}
	e.publish(out)
}

// BoxDied implements airlock.Observer.
func (e *Events) BoxDied(ev airlock.BoxDiedEvent) {
	e.publish(Event{Type: EventBoxDied, BoxID: ev.BoxID, Reason: ev.Cause})
}

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

func (s *Server) registerEvents() {
	sse.Register(s.api, huma.Operation{
		OperationID: "events", Method: http.MethodGet, Path: "/v1/events", Tags: []string{"server"},
		Summary: "Stream events (Server-Sent Events)",
		Description: "Box created/started/stopped/removed/died and exec started/ended, as they happen, one SSE `message` " +
			"per event (JSON). A client that falls 1024 events behind, or does not read for 30 s (airlock serve --write-stall), is disconnected; " +
			"past the server's limit of open streams (--max-subscribers, 64 by default) a new one gets 503 too_many_subscribers.",
		Errors: []int{http.StatusServiceUnavailable},
	}, map[string]any{"message": Event{}}, func(ctx context.Context, _ *struct{}, send sse.Sender) {
		if s.events == nil {
			return
		}
		ch, cancel := s.events.subscribe()
		defer cancel()
		// A first message, so clients know they are subscribed.
		if err := send.Data(Event{Type: EventStreamOpen, Time: time.Now().UTC()}); err != nil {
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.shutdown:
				return
			case ev, ok := <-ch:
				if !ok {
					return
				}
				if !s.eventVisible(ctx, ev) {
					continue // another tenant's box
				}
				if err := send.Data(ev); err != nil {
					return
				}
			}
		}
	})
}
