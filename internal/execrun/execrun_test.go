package execrun

import (
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/boundedpipe"
)

func TestMergeEnvLaterListsWinFirstOrderKept(t *testing.T) {
	got := MergeEnv([]string{"PATH=/bin", "A=1"}, nil, []string{"B=2", "PATH=/usr/bin"}, []string{"A=3"})
	want := []string{"PATH=/usr/bin", "A=3", "B=2"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("MergeEnv = %q, want %q", got, want)
	}
	if First("", "", "x", "y") != "x" || First("", "") != "" {
		t.Error("First: want the first non-empty value, else empty")
	}
}

func TestDeadlineTakesTheSoonerContextDeadline(t *testing.T) {
	if l := Deadline(context.Background(), 0, 0, time.Second); l.Timeout != 0 || l.FromCtx || l.Grace != DefaultKillGrace {
		t.Errorf("no deadline: %+v, want no timeout and the default grace", l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if l := Deadline(ctx, time.Minute, time.Second, 0); l.Timeout != time.Minute || l.FromCtx || l.Host() != time.Minute+time.Second {
		t.Errorf("timeout sooner than ctx: %+v, want the timeout", l)
	}
	if l := Deadline(ctx, 0, 0, 0); l.Timeout <= 59*time.Minute || !l.FromCtx {
		t.Errorf("no timeout: %+v, want the context's deadline", l)
	}
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if l := Deadline(past, 0, 0, 0); l.Timeout != time.Millisecond || !l.FromCtx {
		t.Errorf("deadline passed: %+v, want 1ms", l)
	}
}

// fakeProc is an agent exec that ends when end is called (or, with
// endOnKill, when it is killed).
type fakeProc struct {
	done      chan struct{}
	once      sync.Once
	killed    atomic.Bool
	endOnKill bool
	exit      client.Exit
	err       error
}

func newProc() *fakeProc { return &fakeProc{done: make(chan struct{})} }

func (p *fakeProc) end()                       { p.once.Do(func() { close(p.done) }) }
func (p *fakeProc) Done() <-chan struct{}      { return p.done }
func (p *fakeProc) Wait() (client.Exit, error) { <-p.done; return p.exit, p.err }
func (p *fakeProc) Kill() error {
	p.killed.Store(true)
	if p.endOnKill {
		p.end()
	}
	return nil
}

func TestWaitProcessEnds(t *testing.T) {
	p := newProc()
	p.exit = client.Exit{Code: 3}
	p.end()
	canceled := false
	e := Wait(context.Background(), p, Limits{Timeout: time.Hour}, nil, func() { t.Error("unhealthy") }, func() { canceled = true }, nil)
	if e.Exit.Code != 3 || e.Err != nil || e.CtxErr != nil || e.VMGone || e.HostTimedOut || !canceled || p.killed.Load() {
		t.Errorf("end %+v canceled %v killed %v: want exit 3, nothing else", e, canceled, p.killed.Load())
	}
}

// TestWaitHostTimerStopsTrustingTheGuest: an agent that never reports
// the end of a timed exec is not waited for past Timeout+Grace+Slack:
// the box is called unhealthy, the exec killed, and a caller who stopped
// reading its output cannot hold the wait.
func TestWaitHostTimerStopsTrustingTheGuest(t *testing.T) {
	p := newProc()
	p.err = errors.New("stream reset")
	r, pipe := boundedpipe.New(4)
	var unhealthy atomic.Int32
	cancel := func() { p.end() }                  // the call's context: the stream ends
	go pipe.Write([]byte("more than four bytes")) // blocks: nobody reads r
	t0 := time.Now()
	e := Wait(context.Background(), p, Limits{Timeout: 20 * time.Millisecond, Grace: 10 * time.Millisecond, Slack: 10 * time.Millisecond},
		nil, func() { unhealthy.Add(1) }, cancel, []*boundedpipe.Pipe{pipe})
	if !e.HostTimedOut || e.Err == nil || unhealthy.Load() != 1 {
		t.Errorf("end %+v, unhealthy %d: want the host's timeout, once unhealthy", e, unhealthy.Load())
	}
	if d := time.Since(t0); d < 40*time.Millisecond || d > 5*time.Second {
		t.Errorf("waited %s, want about Timeout+Grace+Slack (40ms)", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !p.killed.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !p.killed.Load() {
		t.Error("the exec was not killed")
	}
	if b, _ := io.ReadAll(r); len(b) > 4 {
		t.Errorf("read %q after the wait, want at most what the pipe held", b)
	}
}

func TestWaitContextCancelKills(t *testing.T) {
	p := newProc()
	p.endOnKill = true
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e := Wait(ctx, p, Limits{}, nil, func() { t.Error("unhealthy") }, func() {}, nil)
	if !errors.Is(e.CtxErr, context.Canceled) || !p.killed.Load() {
		t.Errorf("end %+v killed %v: want ctx's error and a kill", e, p.killed.Load())
	}
}

// TestWaitContextDeadlineIsTheAgentsTimeout: a timeout taken from the
// context's deadline is the agent's to enforce: its report is waited for
// (no kill, no context error), and one that does not come within
// Grace+Slack makes the box unhealthy.
func TestWaitContextDeadlineIsTheAgentsTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	p := newProc()
	p.exit = client.Exit{TimedOut: true}
	go func() {
		<-ctx.Done()
		time.Sleep(5 * time.Millisecond)
		p.end()
	}()
	e := Wait(ctx, p, Deadline(ctx, 0, time.Hour, 0), nil, func() { t.Error("unhealthy") }, func() {}, nil)
	if e.CtxErr != nil || !e.Exit.TimedOut || p.killed.Load() {
		t.Errorf("end %+v killed %v: want the agent's timed-out report", e, p.killed.Load())
	}

	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	p2 := newProc()
	unhealthy := false
	l := Deadline(ctx2, 0, 10*time.Millisecond, 10*time.Millisecond)
	e = Wait(ctx2, p2, l, nil, func() { unhealthy = true }, p2.end, nil)
	if !errors.Is(e.CtxErr, context.DeadlineExceeded) || !unhealthy {
		t.Errorf("end %+v unhealthy %v: want the deadline's error and unhealthy", e, unhealthy)
	}
}

func TestWaitVMGoneDropsOutput(t *testing.T) {
	p := newProc()
	vm := make(chan struct{})
	close(vm)
	r, pipe := boundedpipe.New(4)
	wrote := make(chan error, 1)
	go func() {
		_, err := pipe.Write([]byte("0123456789"))
		wrote <- err
	}()
	e := Wait(context.Background(), p, Limits{}, vm, func() {}, p.end, []*boundedpipe.Pipe{pipe})
	if !e.VMGone {
		t.Errorf("end %+v, want VMGone", e)
	}
	select {
	case <-wrote:
	case <-time.After(5 * time.Second):
		t.Fatal("a writer blocked on a full pipe was not released")
	}
	b, err := io.ReadAll(r)
	if err != nil || len(b) > 4 {
		t.Errorf("read %q, %v: want at most the pipe's 4 bytes, then EOF", b, err)
	}
}

func TestCopyStdinAndCounting(t *testing.T) {
	var in stdinRec
	CopyStdin(&in, strings.NewReader("hello"))
	if in.buf.String() != "hello" || !in.closed {
		t.Errorf("stdin got %q closed %v", in.buf.String(), in.closed)
	}
	var n atomic.Int64
	var sb strings.Builder
	w := Counting(&sb, &n)
	io.WriteString(w, "abc")
	io.WriteString(w, "de")
	if n.Load() != 5 || sb.String() != "abcde" || Counting(nil, &n) != nil {
		t.Errorf("counted %d of %q", n.Load(), sb.String())
	}
}

type stdinRec struct {
	buf    strings.Builder
	closed bool
}

func (s *stdinRec) WriteStdin(b []byte) error { s.buf.Write(b); return nil }
func (s *stdinRec) CloseStdin() error         { s.closed = true; return nil }

func TestOutcome(t *testing.T) {
	dead := errors.New("vm died")
	lost := func(err error) error { return errors.New("lost: " + err.Error()) }
	noDeath := func() error { return nil }
	call := errors.New("stream reset")
	for _, c := range []struct {
		e    End
		dead func() error
		want string
	}{
		{End{}, noDeath, ""},
		{End{HostTimedOut: true, Err: call}, noDeath, ""},
		{End{CtxErr: context.Canceled}, noDeath, "context canceled"},
		{End{CtxErr: context.DeadlineExceeded, Exit: client.Exit{TimedOut: true}}, noDeath, ""},
		{End{CtxErr: context.Canceled, Err: call}, func() error { return dead }, "vm died"},
		{End{CtxErr: context.Canceled, Err: call}, noDeath, "context canceled"},
		{End{Err: call}, noDeath, "lost: stream reset"},
	} {
		got := ""
		if err := c.e.Outcome(c.dead, lost); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%+v: %q, want %q", c.e, got, c.want)
		}
	}
}

func TestCheckSize(t *testing.T) {
	if CheckSize(24, 80) != nil || CheckSize(65535, 1) != nil || CheckSize(0, 80) == nil || CheckSize(24, 65536) == nil {
		t.Error("CheckSize: want 1..65535 each way")
	}
}
