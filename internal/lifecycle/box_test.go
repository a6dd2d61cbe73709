package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/boxvm"
	"github.com/airlock-run/airlock/internal/netstack/helper"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// machine is a fake boot "running" as this test process (its handle is
// alive), until Quit or Kill; dead makes it end at once, as a machine
// that died while it booted.
type machine struct {
	h        vmm.Handle
	exit     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	killed   bool
	released int
}

func newMachine() *machine {
	return &machine{h: vmm.Handle{PID: os.Getpid(), Start: vmm.StartTime(os.Getpid())}, exit: make(chan struct{})}
}

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
	return nil, errors.New("no agent answers")
}
func (m *machine) Death() vmm.Death               { return vmm.Death{Cause: "guest kernel panic"} }
func (m *machine) Quit(ctx context.Context) error { m.end(); return nil }
func (m *machine) Kill() error {
	m.mu.Lock()
	m.killed = true
	m.mu.Unlock()
	m.end()
	return nil
}
func (m *machine) Release()             { m.mu.Lock(); m.released++; m.mu.Unlock() }
func (m *machine) Console(n int) string { return "[ boot messages ]" }
func (m *machine) wasKilled() bool      { m.mu.Lock(); defer m.mu.Unlock(); return m.killed }

// driver attaches to the one machine it holds.
type driver struct{ m *machine }

func (d *driver) Name() string                                 { return "test" }
func (d *driver) Create(ctx context.Context, s vmm.Spec) error { return nil }
func (d *driver) Start(ctx context.Context, s vmm.Spec) (vmm.Machine, error) {
	return d.m, nil
}
func (d *driver) Attach(s vmm.Spec, h vmm.Handle) vmm.Machine { return d.m }

// died is a death as the caller's public error.
type died struct{ vmm.Death }

func (d died) Error() string { return "VM died: " + d.Cause }

var errNotRunning = errors.New("box is not running")

// box is a Box and its host: the record as the handle has it, what the
// engine told it.
type box struct {
	*Box
	t   *testing.T
	drv *driver

	mu      sync.Mutex
	rec     *store.Box
	forgot  bool
	stopped int // Stop's stopping calls
}

func newBox(t *testing.T) *box {
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	rec := &store.Box{ID: "0123456789ab", Image: "test", ImageDigest: "sha256:00", Config: []byte("{}"), State: store.StateCreated, Created: time.Now()}
	if err := db.Insert(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	b := &box{t: t, drv: &driver{m: newMachine()}, rec: rec}
	boxDir := filepath.Join(dir, "boxes", rec.ID)
	if err := os.MkdirAll(boxDir, 0o700); err != nil {
		t.Fatal(err)
	}
	b.Box = &Box{ID: rec.ID, Dir: boxDir, DB: db, Drv: b.drv, Held: &Ports{}, Host: b}
	b.VM = boxvm.New(rec.ID, filepath.Join(boxDir, "console.log"), b)
	return b
}

func (b *box) record() *store.Box { b.mu.Lock(); defer b.mu.Unlock(); return b.rec }

func (b *box) setRecord(rec *store.Box) { b.mu.Lock(); b.rec = rec; b.mu.Unlock() }

func (b *box) stored() *store.Box {
	rec, err := b.DB.Get(context.Background(), b.ID)
	if err != nil {
		b.t.Fatal(err)
	}
	return rec
}

// Host
func (b *box) Spec(rec *store.Box) vmm.Spec { return vmm.Spec{ID: b.ID, Dir: b.Dir} }
func (b *box) StoreErr(err error) error     { return errors.Join(errors.New("no such box"), err) }
func (b *box) Forget()                      { b.mu.Lock(); b.forgot = true; b.mu.Unlock() }

// boxvm.Host
func (b *box) Boot() (*store.Box, vmm.Machine) { return b.record(), b.drv.m }
func (b *box) Err(d vmm.Death) error           { return died{d} }
func (b *box) NotRunning(bool) error           { return errNotRunning }
func (b *box) DialErr(ctx context.Context, rec *store.Box, err error) error {
	return err
}
func (b *box) Paused(context.Context, *store.Box) (bool, error) { return false, nil }
func (b *box) Ending(vmm.Machine) (func(), bool)                { return func() {}, true }
func (b *box) Died(vmm.Machine, vmm.Death)                      {}
func (b *box) Ended(vmm.Machine, string)                        {}

// launch is a start of b's machine that records what it went through.
type launch struct {
	Launch
	steps []string
	ended error
}

func (b *box) launch() *launch {
	l := &launch{}
	step := func(s string) { l.steps = append(l.steps, s) }
	l.Launch = Launch{
		Spec: vmm.Spec{ID: b.ID, Dir: b.Dir},
		Begin: func() func(error) {
			step("begin")
			return func(err error) { l.ended = err; step("end") }
		},
		Prepare: func(ctx context.Context) (func(context.Context) (vmm.Disks, error), error) {
			step("prepare")
			return func(context.Context) (vmm.Disks, error) { step("disks"); return vmm.Disks{}, nil }, nil
		},
		Reserve: func(ctx context.Context) (func(), error) {
			step("reserve")
			return func() {}, nil
		},
		Net: func() (*helper.Starting, error) { step("net"); return nil, nil },
		Machine: func(ctx context.Context, s vmm.Spec) (vmm.Machine, error) {
			step("machine")
			return b.drv.Start(ctx, s)
		},
		Running: func(rec *store.Box) { step("running"); b.setRecord(rec) },
		Ready:   func(ctx context.Context) error { step("ready"); return nil },
		IsDeath: func(err error) bool { var d died; return errors.As(err, &d) },
	}
	return l
}

func TestStartWhoseAgentNeverAnswersLeavesNothingRunning(t *testing.T) {
	b := newBox(t)
	l := b.launch()
	err := b.Start(context.Background(), b.record(), l.Launch)
	if err == nil || !strings.Contains(err.Error(), "did not come up") || !strings.Contains(err.Error(), "[ boot messages ]") {
		t.Fatalf("Start = %v; want a failed boot with the console's tail", err)
	}
	if got := strings.Join(l.steps, " "); got != "begin prepare reserve disks net machine running end" {
		t.Errorf("steps %q", got)
	}
	if l.ended != err {
		t.Errorf("Begin's end got %v, want Start's error", l.ended)
	}
	if !b.drv.m.wasKilled() {
		t.Error("the machine of a failed start was not killed")
	}
	if st := b.stored().State; st != store.StateStopped {
		t.Errorf("record state %q after a failed start, want stopped", st)
	}
}

func TestStartReturnsADeathAsItIs(t *testing.T) {
	b := newBox(t)
	b.drv.m.end() // died as it booted
	l := b.launch()
	err := b.Start(context.Background(), b.record(), l.Launch)
	var d died
	if !errors.As(err, &d) || strings.Contains(err.Error(), "did not come up") {
		t.Fatalf("Start = %v; want the death, as it is", err)
	}
}

func TestStartStopsAtTheFirstRefusal(t *testing.T) {
	for _, c := range []struct {
		name, steps string
		set         func(l *launch, err error)
	}{
		{"prepare", "begin prepare end", func(l *launch, err error) {
			l.Prepare = func(context.Context) (func(context.Context) (vmm.Disks, error), error) {
				l.steps = append(l.steps, "prepare")
				return nil, err
			}
		}},
		{"reserve", "begin prepare reserve end", func(l *launch, err error) {
			l.Reserve = func(context.Context) (func(), error) { l.steps = append(l.steps, "reserve"); return nil, err }
		}},
		{"machine", "begin prepare reserve disks net machine end", func(l *launch, err error) {
			l.Machine = func(context.Context, vmm.Spec) (vmm.Machine, error) {
				l.steps = append(l.steps, "machine")
				return nil, err
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBox(t)
			l := b.launch()
			refused := errors.New(c.name + " refused")
			c.set(l, refused)
			err := b.Start(context.Background(), b.record(), l.Launch)
			if !errors.Is(err, refused) {
				t.Fatalf("Start = %v, want %v", err, refused)
			}
			if got := strings.Join(l.steps, " "); got != c.steps {
				t.Errorf("steps %q, want %q", got, c.steps)
			}
			if st := b.stored().State; st != store.StateCreated {
				t.Errorf("record state %q, want created", st)
			}
		})
	}
}

func TestStartOfARunningBoxConnects(t *testing.T) {
	b := newBox(t)
	h := b.drv.m.Handle()
	rec := *b.record()
	rec.State, rec.PID, rec.PIDStart = store.StateRunning, h.PID, h.Start
	b.setRecord(&rec)
	l := b.launch()
	err := b.Start(context.Background(), &rec, l.Launch)
	if err == nil || !strings.Contains(err.Error(), "no agent answers") || len(l.steps) != 0 {
		t.Errorf("Start of a running box = %v, steps %q; want its connection's error, nothing started", err, l.steps)
	}
}

func TestStopAndRemove(t *testing.T) {
	b := newBox(t)
	ctx := context.Background()
	h := b.drv.m.Handle()
	if err := b.DB.SetRunning(ctx, b.ID, h.PID, h.Start, time.Now()); err != nil {
		t.Fatal(err)
	}
	rec := b.stored()
	b.setRecord(rec)
	// A running box is refused by running's error, and stays.
	refused := errors.New("running: stop it first")
	if gone, err := b.Remove(ctx, func(*store.Box) error { return refused }); gone || !errors.Is(err, refused) {
		t.Fatalf("Remove of a running box = %v, %v; want refused", gone, err)
	}
	if b.drv.m.wasKilled() || b.stored().State != store.StateRunning {
		t.Fatal("a refused removal ended the box")
	}
	was, err := b.Stop(ctx, rec, 0, func() { b.stopped++ })
	if err != nil || !was || b.stopped != 1 {
		t.Fatalf("Stop = %v, %v (stopping told %d times); want it stopped", was, err, b.stopped)
	}
	if b.drv.m.Alive() || b.drv.m.released != 1 || b.stored().State != store.StateStopped {
		t.Errorf("after Stop: machine alive %v, released %d, state %q", b.drv.m.Alive(), b.drv.m.released, b.stored().State)
	}
	if was, err := b.Stop(ctx, b.stored(), 0, func() { b.stopped++ }); err != nil || was || b.stopped != 1 {
		t.Errorf("Stop of a stopped box = %v, %v (stopping told %d times)", was, err, b.stopped)
	}
	gone, err := b.Remove(ctx, func(*store.Box) error { t.Error("a stopped box taken for running"); return nil })
	if !gone || err != nil || !b.forgot {
		t.Fatalf("Remove = %v, %v (forgotten %v)", gone, err, b.forgot)
	}
	if _, err := os.Stat(b.Dir); !os.IsNotExist(err) {
		t.Errorf("box directory left: %v", err)
	}
	if _, err := b.DB.Get(ctx, b.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("record left: %v", err)
	}
	if _, err := b.Remove(ctx, nil); err == nil || !strings.Contains(err.Error(), "no such box") {
		t.Errorf("Remove of a removed box = %v, want the host's store error", err)
	}
}

func TestRemoveForcedKillsTheMachine(t *testing.T) {
	b := newBox(t)
	ctx := context.Background()
	h := b.drv.m.Handle()
	if err := b.DB.SetRunning(ctx, b.ID, h.PID, h.Start, time.Now()); err != nil {
		t.Fatal(err)
	}
	b.setRecord(b.stored())
	gone, err := b.Remove(ctx, func(*store.Box) error { return nil })
	if !gone || err != nil || !b.drv.m.wasKilled() {
		t.Fatalf("forced Remove = %v, %v, killed %v", gone, err, b.drv.m.wasKilled())
	}
}

func TestCreatePreparesTheBoxDirectory(t *testing.T) {
	b := newBox(t)
	b.Dir = filepath.Join(t.TempDir(), "new")
	ctx := context.Background()
	disks := func(context.Context) (vmm.Disks, error) { return vmm.Disks{Base: "/base.erofs"}, nil }
	var got vmm.Spec
	prepare := func(_ context.Context, s vmm.Spec) error { got = s; return nil }
	if err := b.Create(ctx, vmm.Spec{ID: b.ID, Dir: b.Dir}, disks, t.TempDir(), prepare); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(b.Dir); err != nil || !fi.IsDir() || got.Disks.Base != "/base.erofs" {
		t.Errorf("box directory %v; prepare got disks %+v", err, got.Disks)
	}
	// Without prepare, the driver's Create prepares it.
	if err := b.Create(ctx, vmm.Spec{ID: b.ID, Dir: b.Dir}, disks, t.TempDir(), nil); err != nil {
		t.Errorf("the driver's Create: %v", err)
	}
	bad := errors.New("no base")
	err := b.Create(ctx, vmm.Spec{}, func(context.Context) (vmm.Disks, error) { return vmm.Disks{}, bad }, t.TempDir(), prepare)
	if !errors.Is(err, bad) || !strings.Contains(err.Error(), b.ID) {
		t.Errorf("Create with disks failing = %v", err)
	}
	// A driver that does not boot from disks gets none.
	if d, err := Disks(ctx, b.Drv, nil, nil, t.TempDir(), b.Dir); err != nil || d != (vmm.Disks{}) {
		t.Errorf("Disks for a driver without disks = %+v, %v", d, err)
	}
}
