package vmm

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Stop ends machine m in the order that loses least: when grace is
// positive, ask (with a context of at most grace, 5 s at most) asks the
// guest to shut down (the agent's Shutdown) and m gets grace to end;
// then Quit, with 3 s to end; then Kill, whose error Stop returns. It
// does not Release m.
func Stop(ctx context.Context, m Machine, grace time.Duration, ask func(ctx context.Context)) error {
	gone := func(d time.Duration) bool {
		deadline := time.Now().Add(d)
		for m.Alive() {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(20 * time.Millisecond)
		}
		return true
	}
	if grace > 0 {
		cctx, cancel := context.WithTimeout(ctx, min(grace, 5*time.Second))
		ask(cctx)
		cancel()
	}
	if gone(grace) {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	m.Quit(qctx)
	cancel()
	if gone(3 * time.Second) {
		return nil
	}
	return m.Kill()
}

// WhilePaused runs f with the machine of spec and h paused: paused first
// unless it was already (then it stays paused), resumed after f unless it
// was. It returns how long f took with the machine paused, and f's error
// joined with a failure to resume.
func WhilePaused(ctx context.Context, p Pauser, spec Spec, h Handle, f func() error) (time.Duration, error) {
	was, err := p.Paused(ctx, spec, h)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	if !was {
		if err := p.Pause(ctx, spec, h); err != nil {
			return 0, fmt.Errorf("pause: %w", err)
		}
	}
	ferr := f()
	if !was {
		if err := p.Resume(context.WithoutCancel(ctx), spec, h); err != nil {
			ferr = errors.Join(ferr, fmt.Errorf("resume: %w", err))
		}
	}
	return time.Since(t0), ferr
}
