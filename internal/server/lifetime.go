package server

import (
	"context"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
)

// DefaultReapInterval is how often Serve looks for boxes past their TTL,
// idle timeout or lease.
const DefaultReapInterval = time.Second

// lifetime is the server-enforced life of one box created through the API
// with ttl, idle_timeout or lease set. It lives in the server's memory: a
// server restart forgets it (the box then lives until removed).
type lifetime struct {
	expires    time.Time     // ttl; zero: none
	idle       time.Duration // idle_timeout; 0: none
	lastUse    time.Time
	lease      time.Duration // 0: none
	leaseUntil time.Time
}

// why returns the reason to remove the box now, "" to keep it.
func (l *lifetime) why(now time.Time) string {
	switch {
	case !l.expires.IsZero() && now.After(l.expires):
		return "ttl"
	case l.idle > 0 && now.Sub(l.lastUse) > l.idle:
		return "idle_timeout"
	case l.lease > 0 && now.After(l.leaseUntil):
		return "lease_expired"
	}
	return ""
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// track records the lifetime asked for in sp for box id.
func (s *Server) track(id string, sp BoxSpec) {
	if sp.TTL <= 0 && sp.IdleTimeout <= 0 && sp.Lease <= 0 {
		return
	}
	now := time.Now()
	l := &lifetime{idle: secs(sp.IdleTimeout), lastUse: now, lease: secs(sp.Lease)}
	if sp.TTL > 0 {
		l.expires = now.Add(secs(sp.TTL))
	}
	l.leaseUntil = now.Add(l.lease)
	s.mu.Lock()
	s.lifetimes[id] = l
	s.mu.Unlock()
}

// forget drops the lifetime of a removed box.
func (s *Server) forget(id string) {
	s.mu.Lock()
	delete(s.lifetimes, id)
	s.mu.Unlock()
}

// touch marks box id used (for idle_timeout).
func (s *Server) touch(id string) {
	s.mu.Lock()
	if l := s.lifetimes[id]; l != nil {
		l.lastUse = time.Now()
	}
	s.mu.Unlock()
}

// busyBoxes counts execs in flight per box, so that a long exec does not
// count as idle.
func (s *Server) execBegin(id string) func() {
	s.mu.Lock()
	s.busy[id]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.busy[id]--
		if s.busy[id] <= 0 {
			delete(s.busy, id)
		}
		if l := s.lifetimes[id]; l != nil {
			l.lastUse = time.Now()
		}
		s.mu.Unlock()
	}
}

// reap removes the boxes whose lifetime is over, until ctx ends.
func (s *Server) reap(ctx context.Context) {
	iv := s.cfg.ReapInterval
	if iv <= 0 {
		iv = DefaultReapInterval
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		var due []string
		var reasons []string
		s.mu.Lock()
		for id, l := range s.lifetimes {
			if s.busy[id] > 0 && l.idle > 0 {
				l.lastUse = now
			}
			if why := l.why(now); why != "" {
				due = append(due, id)
				reasons = append(reasons, why)
				delete(s.lifetimes, id)
			}
		}
		s.mu.Unlock()
		for i, id := range due {
			s.dropCodebox(id)
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := s.rt.Remove(rctx, id, true)
			cancel()
			s.log.Info("box removed", "box", id, "reason", reasons[i], "error", err)
			s.events.publish(Event{Type: EventBoxRemoved, BoxID: id, Reason: reasons[i]})
		}
	}
}

func (s *Server) registerLease() {
	huma.Register(s.api, huma.Operation{
		OperationID: "renew-lease", Method: http.MethodPost, Path: "/v1/boxes/{id}/lease", Tags: []string{"boxes"},
		Summary: "Renew a box's lease",
		Description: "Extends the lease of a box created with `lease` by that many seconds from now. A box whose lease " +
			"runs out is removed: the SDKs renew it while their process lives, so a crashed client leaves no box behind.",
		DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *boxIDInput) (*struct{}, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		l := s.lifetimes[b.ID()]
		if l == nil || l.lease == 0 {
			return nil, &Problem{Status: http.StatusConflict, Title: "Conflict", Code: CodeNoLease,
				Detail: "box " + b.ID() + " has no lease (create it with \"lease\": SECONDS)"}
		}
		l.leaseUntil = time.Now().Add(l.lease)
		return nil, nil
	})
}
