package pool

import (
	"context"
	"fmt"
	"sync"
)

// The room: what the Set counts for the Room's checks, the starts it
// holds a place for, and eviction (the package comment has the rules).

// counts are the Set's Counts now.
func (s *Set[B]) counts() Counts {
	var c Counts
	for _, p := range s.order {
		p.mu.Lock()
		c.Held += len(p.ready) + p.filling + p.claiming
		c.Filling += p.filling
		c.FillingMiB += p.filling * p.spec.MemoryMiB
		p.mu.Unlock()
	}
	s.mu.Lock()
	c.Starting, c.StartingMiB = s.launching, s.launchingMiB
	s.mu.Unlock()
	return c
}

// reserve counts a fill of p in, if the Room has room for one more box of
// p; otherwise it records why not in p.heldBack and returns false.
func (p *pool[B]) reserve(ctx context.Context) bool {
	s := p.s
	s.roomMu.Lock()
	defer s.roomMu.Unlock()
	defer s.changed()
	why := s.room.Fill(ctx, p.spec.MemoryMiB, s.counts())
	p.mu.Lock()
	defer p.mu.Unlock()
	p.heldBack = why
	if why != "" {
		return false
	}
	p.filling++
	return true
}

// checkRoom records in p.heldBack why p, short of its size with no fill
// in progress, cannot fill now ("" when it can), without reserving.
func (p *pool[B]) checkRoom(ctx context.Context) {
	s := p.s
	s.roomMu.Lock()
	defer s.roomMu.Unlock()
	p.mu.Lock()
	short := len(p.ready) < p.spec.Size && p.filling == 0
	p.mu.Unlock()
	if !short {
		return
	}
	why := s.room.Fill(ctx, p.spec.MemoryMiB, s.counts())
	p.mu.Lock()
	p.heldBack = why
	p.mu.Unlock()
	s.changed()
}

// Launch checks the Room before box id of memMiB of guest memory starts
// and holds its place until launched is called (once its machine runs,
// or it failed): other starts and fills of this Set count it meanwhile.
// When evict is set and the Room says it would help (Room.Evict), ready
// pool boxes are removed first, one at a time. The error is Room.Start's.
// s must not be nil.
func (s *Set[B]) Launch(ctx context.Context, id string, memMiB int, evict bool) (launched func(), err error) {
	s.roomMu.Lock()
	defer s.roomMu.Unlock()
	for evict && s.room.Evict(ctx, id, memMiB, s.counts()) && s.evictOne(ctx) {
	}
	if err := s.room.Start(id, memMiB, s.counts()); err != nil {
		return func() {}, err
	}
	s.mu.Lock()
	s.launching++
	s.launchingMiB += memMiB
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.launching--
			s.launchingMiB -= memMiB
			s.mu.Unlock()
		})
	}, nil
}

// evictOne removes the newest ready box of the pool with the most ready
// ones; false when no pool has one.
func (s *Set[B]) evictOne(ctx context.Context) bool {
	var from *pool[B]
	most := 0
	for _, p := range s.order {
		p.mu.Lock()
		if n := len(p.ready); n > most {
			from, most = p, n
		}
		p.mu.Unlock()
	}
	if from == nil {
		return false
	}
	from.mu.Lock()
	n := len(from.ready)
	if n == 0 {
		from.mu.Unlock()
		return true // claimed meanwhile: look again
	}
	e := from.ready[n-1]
	from.ready = from.ready[:n-1]
	from.evicted++
	from.mu.Unlock()
	s.changed()
	if err := from.spec.Factory.Remove(context.WithoutCancel(ctx), e.b); err != nil {
		s.warn(fmt.Sprintf("pool %s: remove box %s to make room: %v", from.spec.Name, e.b.ID(), err))
	}
	return true
}
