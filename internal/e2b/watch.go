package e2b

import (
	"bufio"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-run/airlock"
	pb "github.com/airlock-run/airlock/internal/e2b/envdpb/filesystem"
	"github.com/airlock-run/airlock/internal/headtail"
)

// watchScript is the watcher run in the box (python3 and inotify): no E2B
// code runs in the guest, and the host keeps no per-file state.
//
//go:embed watch.py
var watchScript string

// Bounds of directory watches.
const (
	// maxWatches bounds the live watches (streams and watchers) of one
	// sandbox.
	maxWatches = 32
	// maxWatcherEvents bounds the events a watcher (CreateWatcher) keeps
	// between two GetWatcherEvents calls; past it events are dropped and
	// the next call fails, saying how many.
	maxWatcherEvents = 10000
	// maxWatchDirs bounds the directories one recursive watch covers.
	maxWatchDirs = 10000
	// maxWatchLine bounds one line of the watcher's output (a path is at
	// most 4096 bytes, JSON escapes at most 6 times that); longer lines
	// are dropped.
	maxWatchLine = 32 << 10
	// watchStartTimeout bounds the start of a watcher (python3 in the box,
	// the watches added).
	watchStartTimeout = 30 * time.Second
)

// watchEvent is one line of the watcher.
type watchEvent struct{ kind, name string }

// guestWatch is a watcher running in the box.
type guestWatch struct {
	p      *airlock.Process
	r      *bufio.Reader
	stderr *headtail.Tail
	once   sync.Once
}

// watchTable is a sandbox's live watches.
type watchTable struct {
	mu       sync.Mutex
	live     map[*guestWatch]struct{}
	watchers map[string]*watcher // CreateWatcher's, by id
	closed   bool
}

func newWatchTable() *watchTable {
	return &watchTable{live: map[*guestWatch]struct{}{}, watchers: map[string]*watcher{}}
}

// stopAll ends every watch (the sandbox is going).
func (t *watchTable) stopAll() {
	t.mu.Lock()
	t.closed = true
	live := t.live
	t.live, t.watchers = map[*guestWatch]struct{}{}, map[string]*watcher{}
	t.mu.Unlock()
	for w := range live {
		w.stop()
	}
}

// forget drops w from the table.
func (t *watchTable) forget(w *guestWatch) {
	t.mu.Lock()
	delete(t.live, w)
	t.mu.Unlock()
}

// startWatch starts a watcher of dir as u and waits until its watches are
// in place: events after it returns are seen.
func (sb *sandbox) startWatch(ctx context.Context, u userInfo, dir string, recursive bool) (*guestWatch, error) {
	fi, err := sb.box.Stat(ctx, dir)
	if err != nil {
		return nil, fsErr(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", dir))
	}
	t := sb.watches
	t.mu.Lock()
	if t.closed || len(t.live) >= maxWatches {
		t.mu.Unlock()
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the sandbox has %d directory watches, the most it may: stop one", maxWatches))
	}
	w := &guestWatch{stderr: &headtail.Tail{Max: 4 << 10}}
	t.live[w] = struct{}{}
	t.mu.Unlock()
	rec := "0"
	if recursive {
		rec = "1"
	}
	// The watcher outlives this request: stop ends it.
	p, err := sb.box.ExecStream(context.WithoutCancel(ctx), "python3", []string{"-c", watchScript, dir, rec, strconv.Itoa(maxWatchDirs)},
		airlock.ExecOptions{User: strconv.Itoa(u.UID) + ":" + strconv.Itoa(u.GID), WorkingDir: "/"})
	if err != nil {
		t.forget(w)
		return nil, connectErr(err)
	}
	w.p, w.r = p, bufio.NewReaderSize(p.Stdout(), 4<<10)
	go io.Copy(w.stderr, p.Stderr())
	first := make(chan error, 1)
	go func() {
		ev, err := w.next()
		if err == nil && ev.kind != "ready" {
			err = errors.New(ev.name)
			if ev.kind != "error" {
				err = fmt.Errorf("the watcher said %q before it was ready", ev.kind)
			}
			err = connect.NewError(connect.CodeInvalidArgument, err)
		} else if err != nil {
			<-p.Done()
			err = connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the watcher (python3 in the box) did not start; watching needs python3 in the sandbox's image: %s", strings.TrimSpace(w.stderr.String())))
		}
		first <- err
	}()
	timer := time.NewTimer(watchStartTimeout)
	defer timer.Stop()
	select {
	case err = <-first:
	case <-timer.C:
		err = connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("the watcher of %s did not start within %s", dir, watchStartTimeout))
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		w.stop()
		t.forget(w)
		return nil, err
	}
	return w, nil
}

// stop ends the watcher in the box.
func (w *guestWatch) stop() {
	w.once.Do(func() {
		if w.p != nil {
			w.p.Kill()
		}
	})
}

// next reads the watcher's next event; an error when it ended.
func (w *guestWatch) next() (watchEvent, error) {
	for {
		line, tooLong, err := headtail.ReadLine(w.r, maxWatchLine)
		if !tooLong && len(line) > 0 {
			var v []string
			if json.Unmarshal(line, &v) == nil && len(v) > 0 {
				ev := watchEvent{kind: v[0]}
				if len(v) > 1 {
					ev.name = v[1]
				}
				return ev, nil
			}
		}
		if err != nil {
			return watchEvent{}, err
		}
	}
}

// eventTypes maps the watcher's kinds to envd's.
var eventTypes = map[string]pb.EventType{
	"create": pb.EventType_EVENT_TYPE_CREATE,
	"write":  pb.EventType_EVENT_TYPE_WRITE,
	"remove": pb.EventType_EVENT_TYPE_REMOVE,
	"rename": pb.EventType_EVENT_TYPE_RENAME,
	"chmod":  pb.EventType_EVENT_TYPE_CHMOD,
}

// errOverflow is the error of a watch whose box-side event queue
// overflowed.
var errOverflow = connect.NewError(connect.CodeResourceExhausted, errors.New("events were lost: the box's inotify queue overflowed (the directory changed faster than the watch was read); list the directory and watch it again"))

// WatchDir streams the events of a directory as they happen. The stream
// reads the watcher as fast as the client reads the stream, so nothing
// piles up on the host; a box-side overflow ends the stream with an error.
func (s fsService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	u, err := s.userFor(ctx, req.Header())
	if err != nil {
		return err
	}
	w, err := s.sb.startWatch(ctx, u, u.resolve(req.Msg.GetPath()), req.Msg.GetRecursive())
	if err != nil {
		return err
	}
	defer s.sb.watches.forget(w)
	defer w.stop()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	events := make(chan watchEvent)
	go func() {
		defer close(events)
		for {
			ev, err := w.next()
			if err != nil {
				return
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	var tick <-chan time.Time
	if k := keepaliveOf(req.Header()); k > 0 {
		t := time.NewTicker(k)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return nil // the watcher ended: the directory is gone
			}
			switch ev.kind {
			case "overflow":
				return errOverflow
			case "error":
				return connect.NewError(connect.CodeFailedPrecondition, errors.New(ev.name))
			}
			typ, ok := eventTypes[ev.kind]
			if !ok {
				continue
			}
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: &pb.FilesystemEvent{Name: ev.name, Type: typ}}}); err != nil {
				return err
			}
		case <-tick:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// watcher is a CreateWatcher watch: its events wait for GetWatcherEvents.
type watcher struct {
	w *guestWatch

	mu      sync.Mutex
	events  []*pb.FilesystemEvent // at most maxWatcherEvents
	dropped int                   // events dropped since the last call
	lost    bool                  // the box's queue overflowed
	end     error                 // why the watcher ended, once it did
}

// collect reads the watcher's events until it ends.
func (wt *watcher) collect() {
	for {
		ev, err := wt.w.next()
		wt.mu.Lock()
		switch {
		case err != nil:
			if wt.end == nil {
				wt.end = errors.New("the watcher ended (the watched directory is gone, or the sandbox stopped)")
			}
		case ev.kind == "overflow":
			wt.lost = true
		case ev.kind == "error":
			wt.end = errors.New(ev.name)
		default:
			if typ, ok := eventTypes[ev.kind]; ok {
				if len(wt.events) < maxWatcherEvents {
					wt.events = append(wt.events, &pb.FilesystemEvent{Name: ev.name, Type: typ})
				} else {
					wt.dropped++
				}
			}
		}
		wt.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (s fsService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	u, err := s.userFor(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	t := s.sb.watches
	t.mu.Lock()
	n := len(t.watchers)
	t.mu.Unlock()
	if n >= maxWatches {
		// Ended watchers (their directory gone) count until removed.
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the sandbox has %d watchers, the most it may: stop one", maxWatches))
	}
	w, err := s.sb.startWatch(ctx, u, u.resolve(req.Msg.GetPath()), req.Msg.GetRecursive())
	if err != nil {
		return nil, err
	}
	b := make([]byte, 8)
	rand.Read(b)
	id := hex.EncodeToString(b)
	wt := &watcher{w: w}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		w.stop()
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox is stopping"))
	}
	t.watchers[id] = wt
	t.mu.Unlock()
	go func() {
		wt.collect()
		t.forget(w)
	}()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents returns the events since the last call. When more came
// than a watcher keeps (maxWatcherEvents), or the box's queue overflowed,
// it fails once with ResourceExhausted, the kept events discarded too (an
// incomplete list would mislead), and the watcher goes on.
func (s fsService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	t := s.sb.watches
	t.mu.Lock()
	wt := t.watchers[req.Msg.GetWatcherId()]
	t.mu.Unlock()
	if wt == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %s not found", req.Msg.GetWatcherId()))
	}
	wt.mu.Lock()
	defer wt.mu.Unlock()
	events, dropped, lost := wt.events, wt.dropped, wt.lost
	wt.events, wt.dropped, wt.lost = nil, 0, false
	switch {
	case dropped > 0:
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d events were dropped: a watcher keeps at most %d events between two calls; the %d kept were discarded too; the watcher goes on: list the directory and read events more often", dropped, maxWatcherEvents, len(events)))
	case lost:
		return nil, errOverflow
	case len(events) == 0 && wt.end != nil:
		return nil, connect.NewError(connect.CodeFailedPrecondition, wt.end)
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: events}), nil
}

func (s fsService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	t := s.sb.watches
	t.mu.Lock()
	wt := t.watchers[req.Msg.GetWatcherId()]
	delete(t.watchers, req.Msg.GetWatcherId())
	t.mu.Unlock()
	if wt == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %s not found", req.Msg.GetWatcherId()))
	}
	wt.w.stop()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
