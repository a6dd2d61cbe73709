package vmm

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// ladderMachine ends at the step given: "ask", "quit", "kill" (never:
// Kill fails).
type ladderMachine struct {
	Machine // the rest is not called
	endAt   string
	ended   atomic.Bool
	steps   []string
}

func (m *ladderMachine) step(s string) {
	m.steps = append(m.steps, s)
	if s == m.endAt {
		m.ended.Store(true)
	}
}
func (m *ladderMachine) Alive() bool                    { return !m.ended.Load() }
func (m *ladderMachine) Quit(ctx context.Context) error { m.step("quit"); return nil }
func (m *ladderMachine) Kill() error {
	m.step("kill")
	if m.ended.Load() {
		return nil
	}
	return errors.New("kill failed")
}

func TestStopClimbsTheLadderOnlyAsFarAsNeeded(t *testing.T) {
	for _, c := range []struct {
		endAt string
		grace time.Duration
		want  string
	}{
		{"ask", time.Second, "ask"},
		{"quit", 50 * time.Millisecond, "ask quit"},
		{"kill", 50 * time.Millisecond, "ask quit kill"},
		{"quit", 0, "quit"}, // at once: nobody is asked
	} {
		m := &ladderMachine{endAt: c.endAt}
		err := Stop(context.Background(), m, c.grace, func(ctx context.Context) {
			if _, ok := ctx.Deadline(); !ok {
				t.Error("ask without a deadline")
			}
			m.step("ask")
		})
		got := ""
		for i, s := range m.steps {
			if i > 0 {
				got += " "
			}
			got += s
		}
		if err != nil || got != c.want {
			t.Errorf("ending at %s with grace %s: steps %q (%v), want %q", c.endAt, c.grace, got, err, c.want)
		}
	}
	if err := Stop(context.Background(), &ladderMachine{endAt: "never"}, 0, nil); err == nil {
		t.Error("a failed kill is no error")
	}
}

type fakePauser struct {
	paused          bool
	pauses, resumes int
	resumeErr       error
}

func (p *fakePauser) Pause(context.Context, Spec, Handle) error {
	p.paused = true
	p.pauses++
	return nil
}
func (p *fakePauser) Resume(context.Context, Spec, Handle) error {
	p.paused = false
	p.resumes++
	return p.resumeErr
}
func (p *fakePauser) Paused(context.Context, Spec, Handle) (bool, error) { return p.paused, nil }

func TestWhilePausedLeavesThePauseAsItWas(t *testing.T) {
	p := &fakePauser{}
	d, err := WhilePaused(context.Background(), p, Spec{}, Handle{}, func() error {
		if !p.paused {
			t.Error("f ran on a running machine")
		}
		time.Sleep(10 * time.Millisecond)
		return nil
	})
	if err != nil || p.paused || p.pauses != 1 || p.resumes != 1 || d < 10*time.Millisecond {
		t.Errorf("running machine: %v %+v paused for %s", err, p, d)
	}
	p = &fakePauser{paused: true}
	if _, err := WhilePaused(context.Background(), p, Spec{}, Handle{}, func() error { return nil }); err != nil || !p.paused || p.pauses+p.resumes != 0 {
		t.Errorf("paused machine: %v %+v, want it left paused", err, p)
	}
	p = &fakePauser{resumeErr: errors.New("qmp gone")}
	ferr := errors.New("copy failed")
	if _, err := WhilePaused(context.Background(), p, Spec{}, Handle{}, func() error { return ferr }); !errors.Is(err, ferr) || !errors.Is(err, p.resumeErr) {
		t.Errorf("errors: %v, want f's and the resume's", err)
	}
}

func TestWaitGone(t *testing.T) {
	if !(Handle{}).WaitGone(context.Background()) {
		t.Error("no process: want gone")
	}
	self := Handle{PID: os.Getpid(), Start: StartTime(os.Getpid())}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if self.WaitGone(ctx) {
		t.Error("this process reported gone")
	}
}

type warnDriver struct {
	Driver
	info BootInfo
	err  error
}

func (d warnDriver) BootInfo() (BootInfo, error) { return d.info, d.err }

func TestBootWarnings(t *testing.T) {
	if w := BootWarnings(warnDriver{info: BootInfo{Warnings: []string{"TCG"}}}); len(w) != 1 || w[0] != "TCG" {
		t.Errorf("BootWarnings = %v", w)
	}
	if BootWarnings(warnDriver{err: errors.New("no kernel")}) != nil {
		t.Error("warnings from a failed BootInfo")
	}
	var plain struct{ Driver }
	if BootWarnings(plain) != nil {
		t.Error("warnings from a driver that does not report boots")
	}
}
