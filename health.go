package airlock

import (
	"context"
	"fmt"
	"time"
)

// hostSlack is how long past an exec's timeout and kill grace the host
// waits for the agent to report the exit before it stops trusting the
// guest: the call then returns TimedOut on the host's own authority and the
// box is marked unhealthy. Generous, for TCG guests under load.
const hostSlack = 8 * time.Second

// probeTimeout bounds the Hello that checks an unhealthy box still
// answers; a box that does not is killed.
const probeTimeout = 20 * time.Second

// Unhealthy returns why the box was declared unhealthy ("" when it was
// not): its agent failed to report the end of a timed-out exec in time.
// The mark stays until the box is stopped; a box whose agent then does not
// answer a Hello within 20 s is killed (later calls return ErrBoxDied).
func (b *Box) Unhealthy() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unhealthy
}

// markUnhealthy records why, and checks in the background that the agent
// still answers; if it does not, the machine is killed (through the VM
// driver), and later calls return a DiedError saying so.
func (b *Box) markUnhealthy(why string) {
	b.mu.Lock()
	first := b.unhealthy == ""
	if first {
		b.unhealthy = why
	}
	conn, m := b.conn, b.m
	if m == nil {
		m = b.machine(b.rec, b.cfg)
	}
	b.mu.Unlock()
	if !first || conn == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		if _, err := conn.Hello(ctx); err == nil {
			return
		}
		b.mu.Lock()
		if b.rec.PID != m.Handle().PID || b.stopping {
			b.mu.Unlock()
			return
		}
		d := b.diedError(m)
		d.Cause = fmt.Sprintf("its agent stopped answering (%s), so airlock killed the VM", why)
		b.died = d
		b.mu.Unlock()
		m.Kill()
	}()
}
