package airlock_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// eventLog is an airlock.EventObserver that keeps what it hears.
type eventLog struct {
	mu  sync.Mutex
	evs []airlock.Event
}

func (l *eventLog) BoxStarted(airlock.BoxStartEvent)   {}
func (l *eventLog) ExecEnded(airlock.ExecEvent)        {}
func (l *eventLog) BoxDied(airlock.BoxDiedEvent)       {}
func (l *eventLog) ImagePulled(airlock.ImagePullEvent) {}
func (l *eventLog) BoxEvent(e airlock.Event) {
	l.mu.Lock()
	l.evs = append(l.evs, e)
	l.mu.Unlock()
}

// take returns the events heard since the last take, as "type" (with
// the box named by names, and a few fields), and the events themselves.
func (l *eventLog) take(names map[string]string) ([]string, []airlock.Event) {
	l.mu.Lock()
	evs := l.evs
	l.evs = nil
	l.mu.Unlock()
	var out []string
	for _, e := range evs {
		s := string(e.Type) + " " + names[e.BoxID]
		switch {
		case e.Reason != "":
			s += " " + e.Reason
		case e.Snapshot != "":
			s += " " + e.Snapshot
		case len(e.Cmd) > 0:
			s += " " + strings.Join(e.Cmd, " ")
		case e.Type == airlock.EventExecEnded:
			s += fmt.Sprintf(" exit=%d", e.ExitCode)
		}
		for _, c := range e.Children {
			s += " " + names[c]
		}
		out = append(out, s)
	}
	return out, evs
}

// TestEventsOrderedAndComplete: every transition of a box's life makes
// exactly one event, in the order the calls made them: created before
// started, pause/resume/snapshot/fork/suspend, every exec started and
// ended with one ExecID; a stop of a stopped box and a pause of a paused
// one make none; a VM killed makes one box.died; an AutoRemove box's stop
// says why it is removed.
func TestEventsOrderedAndComplete(t *testing.T) {
	ctx := context.Background()
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	log := &eventLog{}
	r := h.openOpts(t, airlock.Options{Observer: log})
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(ctx, true)
	names := map[string]string{b.ID(): "box"}
	step := func(what string, f func() error, want ...string) []airlock.Event {
		t.Helper()
		if f != nil {
			if err := f(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		got, evs := log.take(names)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("%s: events\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		return evs
	}
	step("create", nil, "box.created box", "box.started box")
	evs := step("exec", func() error {
		_, err := b.Exec(ctx, "sh", []string{"-c", "exit 3"}, airlock.ExecOptions{Timeout: time.Minute})
		return err
	}, "exec.started box sh -c exit 3", "exec.ended box exit=3")
	if evs[0].ExecID == 0 || evs[0].ExecID != evs[1].ExecID {
		t.Errorf("exec ids %d and %d: want one, not 0", evs[0].ExecID, evs[1].ExecID)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Time.Before(evs[i-1].Time) {
			t.Errorf("event %d's time %v is before the one before it (%v)", i, evs[i].Time, evs[i-1].Time)
		}
	}
	step("pause", func() error { return b.Pause(ctx) }, "box.paused box")
	step("pause again", func() error { return b.Pause(ctx) })
	step("resume", func() error { return b.Resume(ctx) }, "box.resumed box")
	step("resume again", func() error { return b.Resume(ctx) })
	step("snapshot", func() error { _, err := b.Snapshot(ctx, "ev1"); return err }, "box.snapshotted box ev1")
	defer r.RemoveSnapshot(ctx, "ev1")
	var kids []*airlock.Box
	evs = step("fork", func() error {
		var err error
		kids, err = b.Fork(ctx, 1)
		if err == nil {
			names[kids[0].ID()] = "kid"
		}
		return err
	}, "box.created kid", "box.started kid", "box.forked box kid")
	step("remove the child", func() error { return kids[0].Remove(ctx, true) }, "box.removed kid removed")
	step("suspend", func() error { return b.Suspend(ctx) },
		"exec.started box sync", "exec.ended box exit=0", "box.suspended box")
	step("resume from disk", func() error { return b.Resume(ctx) }, "box.resumed box")
	step("stop", func() error { return b.Stop(ctx) }, "box.stopped box")
	step("stop again", func() error { return b.Stop(ctx) })
	step("start", func() error { return b.Start(ctx) }, "box.started box")
	// Its VM killed: one box.died, with the cause, once its watcher sees.
	info, err := b.Info(ctx)
	if err != nil || info.PID == 0 {
		t.Fatalf("info %+v, %v", info, err)
	}
	syscall.Kill(info.PID, syscall.SIGKILL)
	var died []string
	for deadline := time.Now().Add(30 * time.Second); len(died) == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		died, _ = log.take(names)
	}
	if len(died) != 1 || !strings.HasPrefix(died[0], "box.died box ") {
		t.Fatalf("VM killed: events %q, want one box.died with its cause", died)
	}
	step("remove", func() error { return b.Remove(ctx, true) }, "box.removed box removed")

	// An AutoRemove box goes with its stop: one event says why.
	a, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, AutoRemove: true})
	if err != nil {
		t.Fatal(err)
	}
	names[a.ID()] = "auto"
	step("auto: create", nil, "box.created auto", "box.started auto")
	step("auto: stop", func() error { return a.Stop(ctx) }, "box.stopped auto", "box.removed auto auto_remove")
}

// sseStream reads Server-Sent Events of GET /v1/events into a channel.
func sseStream(t *testing.T, url string, hdr ...string) <-chan server.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	ch := make(chan server.Event, 4096)
	go func() {
		defer resp.Body.Close()
		defer close(ch)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		id := ""
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
				id = v
			}
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev server.Event
			if json.Unmarshal([]byte(data), &ev) != nil {
				continue
			}
			if ev.Seq > 0 && ev.Type != server.EventStreamOpen && ev.Type != server.EventEventsDropped && id != strconv.FormatUint(ev.Seq, 10) {
				ev.Error = "sse id " + id + " is not the seq" // seen by the test
			}
			id = ""
			ch <- ev
		}
	}()
	return ch
}

// nextEvents takes n events from ch (within tens of seconds).
func nextEvents(t *testing.T, ch <-chan server.Event, n int) []server.Event {
	t.Helper()
	var out []server.Event
	deadline := time.After(60 * time.Second)
	for len(out) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("stream ended after %d events of %d: %+v", len(out), n, out)
			}
			out = append(out, ev)
		case <-deadline:
			t.Fatalf("%d events of %d in 60 s: %+v", len(out), n, out)
		}
	}
	return out
}

// TestEventsServeFake: /v1/events of airlock serve over the library's
// events, on the fake driver: a box driven through REST (create, exec, a
// code run, pause, resume, stop, start, remove) gives exactly its
// transitions, in order, numbered 1, 2, 3... with the SSE id the seq; a
// stream that resumes with ?since=N or Last-Event-ID gets what followed N
// and then new events; one resuming from a seq this server never made is
// told so by an events.dropped before the backlog.
func TestEventsServeFake(t *testing.T) {
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	events := server.NewEvents()
	r := h.openOpts(t, airlock.Options{Observer: events})
	s := server.New(server.Config{Runtime: r, Events: events})
	ts := httptest.NewServer(s.Handler(false))
	t.Cleanup(ts.Close) // after the streams end (cleanups run last first)
	live := sseStream(t, ts.URL+"/v1/events")
	if open := nextEvents(t, live, 1)[0]; open.Type != server.EventStreamOpen || open.Seq != 0 {
		t.Fatalf("first message %+v, want stream.open with seq 0", open)
	}
	call := func(method, path, body string) []byte {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %s %s", method, path, resp.Status, b)
		}
		return b
	}
	var box struct{ ID string }
	json.Unmarshal(call("POST", "/v1/boxes", `{"image":"`+h.image+`"}`), &box)
	p := "/v1/boxes/" + box.ID
	call("POST", p+"/exec", `{"cmd":["sh","-c","exit 4"]}`)
	call("POST", p+"/code/run", `{"code":"print(6*7)"}`)
	call("POST", p+"/pause", `{}`)
	call("POST", p+"/resume", `{}`)
	call("POST", p+"/stop", ``)
	call("POST", p+"/start", ``)
	call("DELETE", p+"?force=true", ``)
	want := []string{"box.created", "box.started", "exec.started sh -c exit 4", "exec.ended exit=4",
		"exec.started", "exec.ended exit=0", // the code run
		"box.paused", "box.resumed", "box.stopped", "box.started", "box.removed removed"}
	got := nextEvents(t, live, len(want))
	var gotS []string
	for i, ev := range got {
		s := ev.Type
		if len(ev.Cmd) > 0 && ev.Cmd[0] == "sh" {
			s += " " + strings.Join(ev.Cmd, " ")
		}
		if ev.ExitCode != nil {
			s += fmt.Sprintf(" exit=%d", *ev.ExitCode)
		}
		if ev.Reason != "" {
			s += " " + ev.Reason
		}
		gotS = append(gotS, s)
		if ev.Seq != uint64(i+1) || ev.BoxID != box.ID || ev.Error != "" {
			t.Errorf("event %d: %+v: want seq %d, box %s", i, ev, i+1, box.ID)
		}
	}
	if strings.Join(gotS, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events\n%s\nwant\n%s", strings.Join(gotS, "\n"), strings.Join(want, "\n"))
	}

	// Resumed after seq 4: the rest, then what comes next.
	for _, resume := range []func() <-chan server.Event{
		func() <-chan server.Event { return sseStream(t, ts.URL+"/v1/events?since=4") },
		func() <-chan server.Event { return sseStream(t, ts.URL+"/v1/events", "Last-Event-ID", "4") },
	} {
		ch := resume()
		evs := nextEvents(t, ch, 1+len(want)-4)
		if evs[0].Type != server.EventStreamOpen || evs[0].Seq != 4 {
			t.Errorf("first message %+v, want stream.open at seq 4", evs[0])
		}
		for i, ev := range evs[1:] {
			if ev.Seq != uint64(5+i) || ev.Type != got[4+i].Type {
				t.Errorf("resumed event %d: %+v, want %+v", i, ev, got[4+i])
			}
		}
		defer func() {
			// The next event reaches it too.
			if ev := nextEvents(t, ch, 1)[0]; ev.Seq != uint64(len(want)+1) || ev.Type != "box.created" {
				t.Errorf("after the backlog: %+v, want the next box.created", ev)
			}
		}()
	}
	// A seq from another server's life (this one restarted).
	ch := sseStream(t, ts.URL+"/v1/events?since=99999")
	evs := nextEvents(t, ch, 3)
	if evs[1].Type != server.EventEventsDropped || !strings.Contains(evs[1].Reason, "restarted") || evs[2].Seq != 1 {
		t.Errorf("since a seq past the last: %+v, want stream.open, events.dropped (restarted), then seq 1", evs)
	}
	b2, err := r.Create(context.Background(), airlock.BoxOptions{Image: h.image})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Remove(context.Background(), true)
	// A bad since is refused before the stream starts.
	resp, err := http.Get(ts.URL + "/v1/events?since=x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 4 {
		t.Errorf("since=x: %s, want a 4xx", resp.Status)
	}
}
