package e2b

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	pb "github.com/airlock-run/airlock/internal/e2b/envdpb/filesystem"
)

// watcherOf returns a sandbox's watcher fed with lines (as the watcher in
// the box prints them), collected to their end.
func watcherOf(t *testing.T, lines string) (fsService, string) {
	t.Helper()
	sb := &sandbox{watches: newWatchTable()}
	wt := &watcher{w: &guestWatch{r: bufio.NewReaderSize(strings.NewReader(lines), 4<<10)}}
	wt.collect()
	sb.watches.watchers["w1"] = wt
	return fsService{sb}, "w1"
}

func getEvents(s fsService, id string) ([]*pb.FilesystemEvent, error) {
	res, err := s.GetWatcherEvents(context.Background(), connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil {
		return nil, err
	}
	return res.Msg.Events, nil
}

// A guest that makes far more events than a watcher keeps cannot grow the
// host's memory: past maxWatcherEvents they are dropped, and the next
// GetWatcherEvents says so (once; the watcher goes on).
func TestWatcherKeepsBoundedEvents(t *testing.T) {
	var b strings.Builder
	n := maxWatcherEvents + 2500
	for i := range n {
		fmt.Fprintf(&b, "[\"create\", \"f%d\"]\n", i)
	}
	// A line over the bound (a hostile watcher) is dropped as it is read.
	b.WriteString(`["create", "` + strings.Repeat("x", maxWatchLine) + "\"]\n")
	s, id := watcherOf(t, b.String())
	wt := s.sb.watches.watchers[id]
	if len(wt.events) != maxWatcherEvents || wt.dropped != n-maxWatcherEvents {
		t.Fatalf("kept %d, dropped %d", len(wt.events), wt.dropped)
	}
	_, err := getEvents(s, id)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "2500 events were dropped") {
		t.Fatalf("over the bound: %v", err)
	}
	// The watcher ended (its input did): the next call says so.
	if _, err := getEvents(s, id); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("after its end: %v", err)
	}
}

// Events come back as envd's types, in order; a box-side overflow fails
// the next call; an unknown watcher is NotFound.
func TestWatcherEvents(t *testing.T) {
	s, id := watcherOf(t, "[\"ready\"]\n[\"create\", \"a\"]\nnot json\n[\"write\", \"a\"]\n[\"rename\", \"a\"]\n[\"remove\", \"sub/b\"]\n[\"chmod\", \"c\"]\n")
	evs, err := getEvents(s, id)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Type.String()+" "+e.Name)
	}
	want := "EVENT_TYPE_CREATE a,EVENT_TYPE_WRITE a,EVENT_TYPE_RENAME a,EVENT_TYPE_REMOVE sub/b,EVENT_TYPE_CHMOD c"
	if strings.Join(got, ",") != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	s, id = watcherOf(t, "[\"create\", \"a\"]\n[\"overflow\"]\n")
	if _, err := getEvents(s, id); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "overflowed") {
		t.Fatalf("overflow: %v", err)
	}
	if _, err := getEvents(s, "nope"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown watcher: %v", err)
	}
}
