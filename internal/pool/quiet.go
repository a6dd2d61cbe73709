package pool

import (
	"context"
	"time"
)

// Claims first, refill after (docs/pool.md, "Refill"). A claim is a few
// milliseconds of work for the host and the claimed box; a fill is a
// restore and a warm-up, hundreds of milliseconds of host CPU under TCG.
// Started at once, the refill that a burst of claims asks for competed
// with the claims and with the claimed boxes' first commands for the same
// CPUs: ten claims at once from `serve --pool python:slim=10` took
// 254/403 ms (p50/p95) to a first `exec true` where one alone took
// ~15-19 ms to claim. So a fill neither starts nor warms its box while a
// claim of the Set is in progress or one ended less than Options.Quiet
// ago; a steady stream of claims defers fills by at most
// Options.MaxDefer. Claims never wait for fills: they take no lock or slot
// that a fill holds while it runs.

// DefaultQuiet is the default of Options.Quiet.
const DefaultQuiet = time.Second

// DefaultMaxDefer is the default of Options.MaxDefer.
const DefaultMaxDefer = 10 * time.Second

// claimBegins counts a claim in progress.
func (s *Set[B]) claimBegins() {
	s.mu.Lock()
	s.claimsNow++
	s.claimSeq++
	s.mu.Unlock()
}

// claimEnds counts a claim done (taken or not).
func (s *Set[B]) claimEnds() {
	s.mu.Lock()
	s.claimsNow--
	s.claimSeq++
	s.mu.Unlock()
}

// calm reports whether fills may go now: no claim in progress, and a
// quiet period seen since the last one (or no claim ever).
func (s *Set[B]) calm() bool {
	if s.quiet <= 0 {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claimsNow == 0 && s.claimSeq == s.calmSeq
}

// awaitQuiet waits until no claim is in progress and none began or ended
// for a whole quiet period, or until it has waited about MaxDefer; false
// when ctx ended first.
func (s *Set[B]) awaitQuiet(ctx context.Context) bool {
	if s.quiet <= 0 {
		return ctx.Err() == nil
	}
	rounds := max(1, int(s.maxDefer/s.quiet))
	for i := 0; ; i++ {
		if s.calm() {
			return ctx.Err() == nil
		}
		if i >= rounds {
			// Claims keep coming: the pool would run dry and creates
			// boot instead, which costs more than a fill.
			return ctx.Err() == nil
		}
		s.mu.Lock()
		seq := s.claimSeq
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return false
		case <-s.clock.After(s.quiet):
		}
		s.mu.Lock()
		if s.claimsNow == 0 && s.claimSeq == seq {
			s.calmSeq = seq
		}
		s.mu.Unlock()
	}
}
