package airlock_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// eventCounter is an EventObserver that counts box events by type.
type eventCounter struct {
	mu sync.Mutex
	n  map[string]map[airlock.EventType]int // by box id
}

func (c *eventCounter) BoxStarted(airlock.BoxStartEvent)   {}
func (c *eventCounter) ExecEnded(airlock.ExecEvent)        {}
func (c *eventCounter) BoxDied(airlock.BoxDiedEvent)       {}
func (c *eventCounter) ImagePulled(airlock.ImagePullEvent) {}
func (c *eventCounter) BoxEvent(ev airlock.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]map[airlock.EventType]int{}
	}
	if c.n[ev.BoxID] == nil {
		c.n[ev.BoxID] = map[airlock.EventType]int{}
	}
	c.n[ev.BoxID][ev.Type]++
}

func (c *eventCounter) count(id string, t airlock.EventType) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id][t]
}

// waitInfo polls b's info until ok says so (bounded: 60 s, for a loaded
// host), and returns it.
func waitInfo(t *testing.T, b *airlock.Box, what string, ok func(airlock.BoxInfo) bool) airlock.BoxInfo {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		info, err := b.Info(context.Background())
		if err == nil && ok(info) {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("box %s: not %s within 60 s: %+v %v", b.ID(), what, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIdleActionOnFake: BoxOptions.IdleAction on the fake driver (with
// snapshots, so that it can suspend). Bad values are refused; an idle
// suspend box is paused to disk by the reaper (stopped, suspended, still
// there), and the next exec resumes it, once for several concurrent
// execs; an idle stop box is stopped, not suspended, and stays so (an
// exec is refused); a suspended box's files call resumes it too.
func TestIdleActionOnFake(t *testing.T) {
	ctx := context.Background()
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	ev := &eventCounter{}
	r := h.openOpts(t, airlock.Options{ReapInterval: 50 * time.Millisecond, Observer: ev})
	create := func(o airlock.BoxOptions) (*airlock.Box, error) {
		o.Image, o.Network = h.image, airlock.NetworkNone
		b, err := r.Create(ctx, o)
		if err == nil {
			t.Cleanup(func() { b.Remove(context.Background(), true) })
		}
		return b, err
	}
	for _, o := range []airlock.BoxOptions{
		{IdleTimeout: time.Minute, IdleAction: "hibernate"},
		{IdleAction: airlock.IdleSuspend}, // no idle timeout
	} {
		if _, err := create(o); !errors.Is(err, airlock.ErrInvalidArgument) {
			t.Errorf("create with idle timeout %s, action %q: %v, want ErrInvalidArgument", o.IdleTimeout, o.IdleAction, err)
		}
	}

	sus, err := create(airlock.BoxOptions{IdleTimeout: 2 * time.Second, IdleAction: airlock.IdleSuspend})
	if err != nil {
		t.Fatal(err)
	}
	stp, err := create(airlock.BoxOptions{IdleTimeout: 2 * time.Second, IdleAction: airlock.IdleStop})
	if err != nil {
		t.Fatal(err)
	}
	suspended := func(i airlock.BoxInfo) bool { return i.State == airlock.BoxStopped && i.Suspended }
	info := waitInfo(t, sus, "suspended when idle", suspended)
	if info.Options.IdleAction != airlock.IdleSuspend || info.IdleDeadline.IsZero() {
		t.Errorf("suspended box's info: idle action %q, idle deadline %v", info.Options.IdleAction, info.IdleDeadline)
	}

	// Several execs at once on the suspended box: each works, and the box
	// is resumed once.
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := sus.Exec(ctx, "echo", []string{"hi"}, airlock.ExecOptions{Timeout: time.Minute})
			if err == nil && strings.TrimSpace(string(res.Stdout)) != "hi" {
				err = errors.New("stdout " + string(res.Stdout))
			}
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("exec on the suspended box: %v", err)
		}
	}
	// (box.suspended is sent once the suspend returns, just after Info
	// shows it: looked at after the resume.)
	if n := ev.count(sus.ID(), airlock.EventBoxSuspended); n != 1 {
		t.Errorf("box.suspended events: %d, want 1", n)
	}
	if n := ev.count(sus.ID(), airlock.EventBoxResumed); n != 1 {
		t.Errorf("box.resumed events after 4 concurrent execs: %d, want 1", n)
	}

	// Suspended again once idle; a file call resumes it.
	waitInfo(t, sus, "suspended again when idle", suspended)
	if err := sus.WriteFile(ctx, "/tmp/f", []byte("x"), 0o644); err != nil {
		t.Fatalf("write a file into the suspended box: %v", err)
	}
	if info, err := sus.Info(ctx); err != nil || info.State != airlock.BoxRunning || info.Suspended {
		t.Errorf("after a file call: %+v %v, want running", info, err)
	}

	// Idle action stop: stopped, not suspended, kept; an exec does not
	// start it.
	waitInfo(t, stp, "stopped when idle", func(i airlock.BoxInfo) bool { return i.State == airlock.BoxStopped })
	if info, err := stp.Info(ctx); err != nil || info.Suspended {
		t.Errorf("idle stop box: %+v %v, want stopped, not suspended", info, err)
	}
	if _, err := stp.Exec(ctx, "true", nil, airlock.ExecOptions{}); !errors.Is(err, airlock.ErrBoxNotRunning) {
		t.Errorf("exec on the idle-stopped box: %v, want ErrBoxNotRunning", err)
	}
}

// A suspended box lists the published ports of the start it was suspended
// in (its resume binds them again), as `airlock ls` and REST show them;
// a stopped box lists none. The ports are the helper's record in the box
// directory (the fake driver runs no network helper: written here).
func TestSuspendedBoxListsItsPortsOnFake(t *testing.T) {
	ctx := context.Background()
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	r := h.openOpts(t, airlock.Options{})
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Network: airlock.NetworkNone, IdleTimeout: time.Hour, IdleAction: airlock.IdleSuspend})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	rec := `[{"host_ip":"127.0.0.1","host_port":18080,"guest_port":8080,"protocol":"tcp"}]`
	if err := os.WriteFile(filepath.Join(filepath.Dir(b.ConsoleLog()), "ports.json"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := airlock.PortMapping{HostIP: "127.0.0.1", HostPort: 18080, GuestPort: 8080, Protocol: "tcp"}
	if !info.Suspended || len(info.Ports) != 1 || info.Ports[0] != want {
		t.Fatalf("suspended box: suspended %v, ports %+v; want %+v", info.Suspended, info.Ports, want)
	}
	if info.Options.IdleTimeout != time.Hour || info.Options.IdleAction != airlock.IdleSuspend {
		t.Errorf("idle settings %v %q", info.Options.IdleTimeout, info.Options.IdleAction)
	}
	if err := b.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx, airlock.StopOptions{Grace: -1}); err != nil {
		t.Fatal(err)
	}
	if info, _ := b.Info(ctx); info.Suspended || len(info.Ports) != 0 {
		t.Fatalf("stopped box: suspended %v, ports %+v; want none", info.Suspended, info.Ports)
	}
}

// TestIdleSuspendWakeFromAnotherRuntime: a box with a published port
// suspended by one runtime's reaper (which then holds the port, for wake
// on traffic, as airlock serve does) is woken by an exec through another
// runtime on the same home (as the CLI's airlock exec is): the resume
// must get the port, not fail with "address already in use".
func TestIdleSuspendWakeFromAnotherRuntime(t *testing.T) {
	ctx := context.Background()
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	home := t.TempDir()
	serve := h.openOpts(t, airlock.Options{Home: home, ReapInterval: 50 * time.Millisecond})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	b, err := serve.Create(ctx, airlock.BoxOptions{Image: h.image, IdleTimeout: 300 * time.Millisecond, IdleAction: airlock.IdleSuspend,
		Ports: []airlock.PortMapping{{HostIP: "127.0.0.1", HostPort: port, GuestPort: 8080}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	waitInfo(t, b, "suspended", func(i airlock.BoxInfo) bool { return i.Suspended })
	cli := h.openOpts(t, airlock.Options{Home: home})
	cb, err := cli.Get(ctx, b.ID())
	if err != nil {
		t.Fatal(err)
	}
	res, err := cb.Exec(ctx, "true", nil, airlock.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec through another runtime on the suspended box: %+v %v", res, err)
	}
}
