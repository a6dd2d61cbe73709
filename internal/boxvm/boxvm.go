// Package boxvm is one box handle's view of the box's current boot: the
// machine it watches, its connection to the guest agent, why the boot
// ended when nobody asked (a death), and whether the box was declared
// unhealthy. A Session connects on demand, watches the machine once per
// boot, turns a transport failure into the death that caused it, and
// probes an unhealthy box's agent (killing a machine whose agent no
// longer answers).
//
// It knows no box store and no public error: the box's record, what a
// death or a refusal looks like to the caller, and what is recorded when
// a machine ends come in through Host (the root package's Box).
package boxvm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Host is the box a Session belongs to.
type Host interface {
	// Boot returns the box's record as the handle has it, and the
	// machine that record names (which may have ended).
	Boot() (*store.Box, vmm.Machine)
	// Err is the error a call gets for death d (the caller's public
	// error type).
	Err(d vmm.Death) error
	// NotRunning is the error of a call into a box that is not running;
	// stopped says its machine was stopped (Stop, Remove) meanwhile.
	NotRunning(stopped bool) error
	// DialErr is the error of a failed connection to the agent of the
	// running box of rec.
	DialErr(ctx context.Context, rec *store.Box, err error) error
	// Paused reports whether the machine of rec is paused: its agent
	// answers no new handshake, and unanswered keepalives are no death.
	// An error says the machine did not answer (frozen, gone, or a
	// driver that cannot tell).
	Paused(ctx context.Context, rec *store.Box) (bool, error)
	// Ending is told that watched machine m ended. ok false makes the
	// Session record nothing (its runtime is closed); else done is called
	// once Died and Ended have been.
	Ending(m vmm.Machine) (done func(), ok bool)
	// Died records death d of m, which ended unasked. It is called with
	// the Session's lock held: it must not call the Session.
	Died(m vmm.Machine, d vmm.Death)
	// Ended is called once m's end is handled (m released unless a stop
	// does that); cause is its death's, "" when it was stopped or its
	// cause was known before.
	Ended(m vmm.Machine, cause string)
}

// Session is a handle's view of its box's current boot. Safe for
// concurrent use.
type Session struct {
	id, console string
	h           Host

	mu sync.Mutex
	// conn is the agent connection (nil: none yet, or dropped).
	conn *client.Client
	// m is the boot being watched (nil: none); vmExit is closed when it
	// ends, and died then says why, unless stopping was set first (Stop
	// or Remove ended it on purpose).
	m      vmm.Machine
	vmExit <-chan struct{}
	// watched is closed once the watcher of m has handled its end.
	watched  <-chan struct{}
	died     *vmm.Death
	stopping bool
	// unhealthy says why the box was declared unhealthy ("" when it was
	// not); reset by Begin.
	unhealthy string
}

// New returns the session of box id, whose console log is at console.
func New(id, console string, h Host) *Session {
	return &Session{id: id, console: console, h: h}
}

// Handle is the machine process that rec names.
func Handle(rec *store.Box) vmm.Handle { return vmm.Handle{PID: rec.PID, Start: rec.PIDStart} }

// Running reports whether rec says the box runs and its machine process
// does: the one test of "recorded running but gone".
func Running(rec *store.Box) bool {
	return rec.State == store.StateRunning && Handle(rec).Alive()
}

// Begin starts a new boot's view: no death, no unhealthy mark, not
// stopping.
func (s *Session) Begin() {
	s.mu.Lock()
	s.died, s.unhealthy, s.stopping = nil, "", false
	s.mu.Unlock()
}

// Restarted forgets a death this session saw, once no machine is watched,
// when running says the box runs again: another process started it
// (Start, Resume) after that boot ended, so its end is history. running
// is asked only then (it looks at a process).
func (s *Session) Restarted(running func() bool) {
	s.mu.Lock()
	if s.died != nil && s.m == nil && running() {
		s.died, s.unhealthy = nil, ""
	}
	s.mu.Unlock()
}

// Stopping marks the boot as ended on purpose (Stop, Remove, a flush
// before a removal): its end is no death.
func (s *Session) Stopping() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
}

// WaitWatcher waits (up to max) until the watcher of an earlier boot that
// ended has handled its end, so that its death is recorded against that
// boot, not taken for the next one's.
func (s *Session) WaitWatcher(ctx context.Context, max time.Duration) error {
	s.mu.Lock()
	old, watched := s.m, s.watched
	s.mu.Unlock()
	if old == nil {
		return nil
	}
	select {
	case <-watched:
	case <-time.After(max):
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// VMExit is closed when the watched boot ends (nil: none watched).
func (s *Session) VMExit() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vmExit
}

// Conn returns the agent connection if there is one, without dialing.
func (s *Session) Conn() *client.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn
}

// DropConn closes the agent connection, if any.
func (s *Session) DropConn() {
	s.mu.Lock()
	s.dropConnLocked()
	s.mu.Unlock()
}

func (s *Session) dropConnLocked() {
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

// Client returns a connected agent client, connecting if needed.
func (s *Session) Client(ctx context.Context) (*client.Client, error) {
	s.mu.Lock()
	if s.conn != nil {
		select {
		case <-s.conn.Done():
			s.conn = nil
		default:
			c := s.conn
			s.mu.Unlock()
			return c, nil
		}
	}
	if d := s.died; d != nil {
		s.mu.Unlock()
		return nil, s.h.Err(*d)
	}
	s.mu.Unlock()
	rec, m := s.h.Boot()
	if !Running(rec) {
		if rec.State == store.StateRunning {
			if err := s.DeadErr(0); err != nil {
				return nil, err
			}
		}
		return nil, s.h.NotRunning(false)
	}
	s.mu.Lock()
	s.watch(m)
	s.mu.Unlock()
	c, err := m.DialAgent(ctx)
	if err != nil {
		if de := s.DeadErr(time.Second); de != nil {
			return nil, de
		}
		return nil, s.h.DialErr(ctx, rec, err)
	}
	// The handshake shows the agent answers (and checks its version): no
	// Hello round trip on top of it.
	s.keepWhilePaused(c, rec)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil { // lost a race with another caller
		c.Close()
		return s.conn, nil
	}
	s.conn = c
	return c, nil
}

// SlowAgentGrace is how long an agent whose machine runs (its QEMU
// answers and is not paused) may leave a keepalive ping unanswered before
// its connection ends: such a guest is slow rather than dead (TCG on a
// loaded host while the guest reclaims memory for an OOM kill left a ping
// unanswered for 8 s in CI). A frozen or gone machine still ends the
// connection after transport.KeepAliveTimeout.
const SlowAgentGrace = 24 * time.Second

// keepWhilePaused keeps connection c to the box of rec open while the box
// is paused: its keepalive pings go unanswered then, and ending the
// connection stopped a box whose main command airlock follows (run -d,
// create IMAGE COMMAND) about 10 s into a pause. A running machine whose
// agent is slow to answer gets SlowAgentGrace.
func (s *Session) keepWhilePaused(c *client.Client, rec *store.Box) {
	c.SetStalled(func(unanswered time.Duration) bool {
		// A paused or running QEMU answers QMP at once; a frozen one
		// (SIGSTOP, a wedged host) does not, and must still be noticed
		// as dead within about the keepalive's time (TestHostile).
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		paused, err := s.h.Paused(ctx, rec)
		if err != nil {
			return false
		}
		return paused || unanswered < SlowAgentGrace
	})
}

// watch starts watching machine m, once per boot. Preconditions: s.mu
// is held.
func (s *Session) watch(m vmm.Machine) {
	if s.m != nil && s.m.Handle() == m.Handle() {
		return
	}
	ch := m.Exited()
	done := make(chan struct{})
	s.m, s.vmExit, s.watched = m, ch, done
	go func() {
		defer close(done)
		<-ch
		end, ok := s.h.Ending(m)
		if !ok {
			return
		}
		defer end()
		var died string // its cause, when it died
		s.mu.Lock()
		if s.m != m {
			// A newer boot is being watched.
			s.mu.Unlock()
			return
		}
		if !s.stopping && s.died == nil { // MarkUnhealthy may have said why first
			d := m.Death()
			s.died = &d
			s.h.Died(m, d)
			died = d.Cause
		}
		// A stop releases the boot itself; releasing here too could race
		// with the next Start and remove the cgroup it just made.
		released := s.stopping
		s.dropConnLocked()
		s.m, s.vmExit = nil, nil
		s.mu.Unlock()
		if !released {
			m.Release()
		}
		s.h.Ended(m, died)
	}()
}

// DeadErr returns the death's error if the machine is known to have
// died, waiting up to wait for the watcher to notice; nil when it runs.
func (s *Session) DeadErr(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		s.mu.Lock()
		d := s.died
		s.mu.Unlock()
		if d != nil {
			return s.h.Err(*d)
		}
		_, m := s.h.Boot()
		if !m.Alive() {
			s.mu.Lock()
			stopping := s.stopping
			s.mu.Unlock()
			if stopping {
				return s.h.NotRunning(true)
			}
			time.Sleep(20 * time.Millisecond)
			s.mu.Lock()
			d = s.died
			s.mu.Unlock()
			if d != nil {
				return s.h.Err(*d)
			}
			return s.h.Err(m.Death())
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CallErr turns a transport error into one that says what happened: the
// VM died (with cause and console), or the connection was lost.
func (s *Session) CallErr(err error) error {
	if de := s.DeadErr(1500 * time.Millisecond); de != nil {
		return de
	}
	var cut error
	s.mu.Lock()
	if s.conn != nil {
		select {
		case <-s.conn.Done():
			cut = s.conn.Err()
			s.conn = nil
		default:
		}
	}
	s.mu.Unlock()
	if errors.Is(cut, client.ErrHostileAgent) {
		return fmt.Errorf("box %s: %w", s.id, cut)
	}
	return fmt.Errorf("box %s: lost the connection to its agent (%v); the box may be overloaded or stopping — its console log %s may say why", s.id, err, s.console)
}

// FreezeTimeout bounds each Freeze call of a snapshot.
const FreezeTimeout = 10 * time.Second

// Freeze stops the guest's processes (the agent's Freeze, within
// FreezeTimeout) and returns what continues them (else the agent does
// after agent.FreezeMax).
func (s *Session) Freeze(ctx context.Context) (thaw func(), err error) {
	c, err := s.Client(ctx)
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, FreezeTimeout)
	defer cancel()
	if err := c.Freeze(fctx, true); err != nil {
		return nil, fmt.Errorf("stop its processes for the snapshot: %w", s.CallErr(err))
	}
	return func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FreezeTimeout)
		defer cancel()
		c.Freeze(tctx, false)
	}, nil
}

// ExecTailWait bounds WaitExecTails.
const ExecTailWait = 200 * time.Millisecond

// WaitExecTails waits (up to ExecTailWait) until the agent has finished
// with the execs of this session's connection that have returned (none
// without a connection).
func (s *Session) WaitExecTails(ctx context.Context) {
	if c := s.Conn(); c != nil {
		c.WaitExecsEnded(ctx, ExecTailWait)
	}
}

// ProbeTimeout bounds the Hello that checks an unhealthy box still
// answers; a box that does not is killed.
const ProbeTimeout = 20 * time.Second

// Unhealthy returns why the box was declared unhealthy ("" when it was
// not).
func (s *Session) Unhealthy() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unhealthy
}

// MarkUnhealthy records why, and checks in the background that the agent
// still answers (within ProbeTimeout); if it does not, the machine is
// killed (through the VM driver), and later calls get a death saying so.
func (s *Session) MarkUnhealthy(why string) {
	s.mu.Lock()
	first := s.unhealthy == ""
	if first {
		s.unhealthy = why
	}
	conn, m := s.conn, s.m
	if m == nil {
		_, m = s.h.Boot()
	}
	s.mu.Unlock()
	if !first || conn == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
		defer cancel()
		if _, err := conn.Hello(ctx); err == nil {
			return
		}
		s.mu.Lock()
		if rec, _ := s.h.Boot(); rec.PID != m.Handle().PID || s.stopping {
			s.mu.Unlock()
			return
		}
		d := m.Death()
		d.Cause = fmt.Sprintf("its agent stopped answering (%s), so airlock killed the VM", why)
		s.died = &d
		s.mu.Unlock()
		m.Kill()
	}()
}
