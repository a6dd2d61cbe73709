package boxvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// machine is a fake boot: it runs until end is called; no agent answers.
type machine struct {
	h        vmm.Handle
	exit     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	released int
}

func newMachine(h vmm.Handle) *machine { return &machine{h: h, exit: make(chan struct{})} }

func (m *machine) end()               { m.once.Do(func() { close(m.exit) }) }
func (m *machine) Handle() vmm.Handle { return m.h }
func (m *machine) Alive() bool {
	select {
	case <-m.exit:
		return false
	default:
		return true
	}
}
func (m *machine) Exited() <-chan struct{} { return m.exit }
func (m *machine) DialAgent(ctx context.Context) (*client.Client, error) {
	return nil, errors.New("no agent")
}
func (m *machine) Death() vmm.Death {
	return vmm.Death{Cause: "guest kernel panic", ConsoleTail: "Kernel panic"}
}
func (m *machine) Quit(ctx context.Context) error { m.end(); return nil }
func (m *machine) Kill() error                    { m.end(); return nil }
func (m *machine) Release() {
	m.mu.Lock()
	m.released++
	m.mu.Unlock()
}
func (m *machine) Console(n int) string { return "" }

func (m *machine) releases() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.released
}

// died is the host's public error for a death.
type died struct{ vmm.Death }

func (d died) Error() string { return "VM died: " + d.Cause }

var errNotRunning = errors.New("box is not running")

// host is a box running as this test process (its handle is alive), on
// machine m; it records what the Session tells it.
type host struct {
	mu      sync.Mutex
	rec     *store.Box
	m       *machine
	closed  bool // the runtime is closed: Ending refuses
	deaths  []string
	ended   []string
	endings int
}

func newHost() *host {
	pid := os.Getpid()
	h := vmm.Handle{PID: pid, Start: vmm.StartTime(pid)}
	return &host{rec: &store.Box{ID: "b1", State: store.StateRunning, PID: h.PID, PIDStart: h.Start}, m: newMachine(h)}
}

func (h *host) Boot() (*store.Box, vmm.Machine) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rec, h.m
}
func (h *host) Err(d vmm.Death) error { return died{d} }
func (h *host) NotRunning(stopped bool) error {
	if stopped {
		return fmt.Errorf("%w: stopped", errNotRunning)
	}
	return errNotRunning
}
func (h *host) DialErr(ctx context.Context, rec *store.Box, err error) error {
	return fmt.Errorf("connect to agent: %w", err)
}
func (h *host) Paused(ctx context.Context, rec *store.Box) (bool, error) { return false, nil }
func (h *host) Ending(m vmm.Machine) (func(), bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endings++
	return func() {}, !h.closed
}
func (h *host) Died(m vmm.Machine, d vmm.Death) {
	h.mu.Lock()
	h.deaths = append(h.deaths, d.Cause)
	h.mu.Unlock()
}
func (h *host) Ended(m vmm.Machine, cause string) {
	h.mu.Lock()
	h.ended = append(h.ended, cause)
	h.mu.Unlock()
}

// state returns what the host was told.
func (h *host) state() (endings int, deaths, ended []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.endings, append([]string(nil), h.deaths...), append([]string(nil), h.ended...)
}

// eventually polls cond for up to 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// watched dials the box once (no agent answers), which starts the watch
// of its machine.
func watched(t *testing.T, s *Session) {
	t.Helper()
	if _, err := s.Client(context.Background()); err == nil || !strings.Contains(err.Error(), "no agent") {
		t.Fatalf("Client with no agent: %v, want the dial's error", err)
	}
}

func TestDeathRecordedOnce(t *testing.T) {
	h := newHost()
	s := New("b1", "/box/console.log", h)
	watched(t, s)
	watched(t, s) // a second dial watches the same boot once
	h.m.end()
	eventually(t, "the watcher to handle the end", func() bool { _, _, e := h.state(); return len(e) == 1 })
	_, deaths, ended := h.state()
	if len(deaths) != 1 || deaths[0] != "guest kernel panic" || ended[0] != "guest kernel panic" {
		t.Errorf("deaths %q, ended %q: want the death recorded once, with its cause", deaths, ended)
	}
	if h.m.releases() != 1 {
		t.Errorf("machine released %d times by the watcher, want 1", h.m.releases())
	}
	var d died
	if _, err := s.Client(context.Background()); !errors.As(err, &d) || d.Cause != "guest kernel panic" {
		t.Errorf("Client after the death: %v, want the host's death error", err)
	}
	if err := s.DeadErr(0); !errors.As(err, &d) {
		t.Errorf("DeadErr after the death: %v", err)
	}
	if err := s.CallErr(errors.New("EOF")); !errors.As(err, &d) {
		t.Errorf("CallErr after the death: %v, want the death, not a lost connection", err)
	}

	// Another process started the box again: the end seen is history.
	h.mu.Lock()
	h.m = newMachine(h.m.h)
	h.mu.Unlock()
	s.Restarted(func() bool { return false })
	var d2 died
	if err := s.DeadErr(0); !errors.As(err, &d2) {
		t.Errorf("DeadErr after Restarted of a box not running: %v, want the death kept", err)
	}
	s.Restarted(func() bool { return true })
	watched(t, s)
}

func TestStopIsNoDeath(t *testing.T) {
	h := newHost()
	s := New("b1", "/box/console.log", h)
	watched(t, s)
	s.Stopping()
	h.m.end()
	eventually(t, "the watcher to handle the end", func() bool { _, _, e := h.state(); return len(e) == 1 })
	_, deaths, ended := h.state()
	if len(deaths) != 0 || ended[0] != "" {
		t.Errorf("a stop: deaths %q, ended %q: want none", deaths, ended)
	}
	if h.m.releases() != 0 {
		t.Error("the watcher released a stopped machine (the stop does, and may race the next start)")
	}
	if err := s.DeadErr(0); !errors.Is(err, errNotRunning) || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("DeadErr after a stop: %v, want not running, stopped", err)
	}
	// The next boot's view starts clean.
	h.mu.Lock()
	h.m = newMachine(h.m.h)
	h.mu.Unlock()
	s.Begin()
	if err := s.WaitWatcher(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.DeadErr(0); err != nil {
		t.Errorf("DeadErr of a running boot: %v", err)
	}
}

func TestClosedRuntimeRecordsNothing(t *testing.T) {
	h := newHost()
	h.closed = true
	s := New("b1", "/box/console.log", h)
	watched(t, s)
	h.m.end()
	eventually(t, "the watcher to see the end", func() bool { n, _, _ := h.state(); return n == 1 })
	if err := s.WaitWatcher(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, deaths, ended := h.state(); len(deaths)+len(ended) != 0 {
		t.Errorf("closed runtime: deaths %q, ended %q: want nothing recorded", deaths, ended)
	}
}

func TestNotRunningAndLostConnection(t *testing.T) {
	h := newHost()
	s := New("b1", "/box/console.log", h)
	h.rec = &store.Box{ID: "b1", State: store.StateStopped}
	if _, err := s.Client(context.Background()); err != errNotRunning {
		t.Errorf("Client of a stopped box: %v, want the host's not running", err)
	}
	h.rec = &store.Box{ID: "b1", State: store.StateRunning, PID: h.m.h.PID, PIDStart: h.m.h.Start}
	err := s.CallErr(errors.New("EOF"))
	if err == nil || !strings.Contains(err.Error(), "lost the connection to its agent (EOF)") || !strings.Contains(err.Error(), "/box/console.log") {
		t.Errorf("CallErr of a live box: %v, want a lost connection naming the console log", err)
	}
}

func TestUnhealthyFirstReasonStays(t *testing.T) {
	s := New("b1", "/box/console.log", newHost())
	s.MarkUnhealthy("exec wedged")
	s.MarkUnhealthy("another")
	if got := s.Unhealthy(); got != "exec wedged" {
		t.Errorf("Unhealthy = %q, want the first reason", got)
	}
	s.Begin()
	if got := s.Unhealthy(); got != "" {
		t.Errorf("Unhealthy after a new boot = %q", got)
	}
}
