//go:build linux

package agent

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
)

// FreezeMax is how long the box's processes stay frozen (Freeze) without
// a call that continues them (Freeze false, Restored): a host that froze
// them for a snapshot and died must not leave the box stopped. A box
// restored from the snapshot counts the time it ran, not the time the
// snapshot was stored.
const FreezeMax = 30 * time.Second

// freezeWait bounds how long Freeze waits for the processes to stop.
const freezeWait = 2 * time.Second

// freezer is the state of Freeze; it lives in the agent's memory, so a
// snapshot holds it: a restored agent knows its box's processes are
// frozen.
type freezer struct {
	mu     sync.Mutex
	frozen bool
	timer  *time.Timer // continues them after FreezeMax
}

// Freeze stops every process an exec started (all exec cgroups, in the
// cgroup v2 freezer) and waits until they are stopped, or continues them
// (req.Freeze false). While frozen, new exec cgroups are made frozen too.
// The host freezes a box around a memory snapshot: boxes restored from
// it run none of the snapshot's processes before Restored has reseeded
// their RNG. Without cgroups (a test agent on a host) it does nothing.
func (s *Server) Freeze(req *agentpb.FreezeRequest) (*agentpb.FreezeResponse, error) {
	if !req.Freeze {
		s.thaw()
		return &agentpb.FreezeResponse{}, nil
	}
	if s.cfg.CgroupRoot == "" {
		return &agentpb.FreezeResponse{}, nil
	}
	s.fr.mu.Lock()
	s.fr.frozen = true
	if s.fr.timer != nil {
		s.fr.timer.Stop()
	}
	s.fr.timer = time.AfterFunc(FreezeMax, func() {
		// No host continued them: reseed from what the guest has (its
		// input pool and CPU RNG) before they run.
		reseed(nil)
		s.thaw()
	})
	s.fr.mu.Unlock()
	dirs := s.execCgroups()
	for _, d := range dirs {
		os.WriteFile(filepath.Join(d, "cgroup.freeze"), []byte("1"), 0)
	}
	deadline := time.Now().Add(freezeWait)
	for _, d := range dirs {
		for !frozen(d) {
			if time.Now().After(deadline) {
				s.thaw()
				return nil, errors.New("freeze: the box's processes did not stop within " + freezeWait.String())
			}
			time.Sleep(time.Millisecond)
		}
	}
	return &agentpb.FreezeResponse{}, nil
}

// thaw continues the frozen processes, if any.
func (s *Server) thaw() {
	s.fr.mu.Lock()
	defer s.fr.mu.Unlock()
	if !s.fr.frozen {
		return
	}
	s.fr.frozen = false
	if s.fr.timer != nil {
		s.fr.timer.Stop()
		s.fr.timer = nil
	}
	for _, d := range s.execCgroups() {
		os.WriteFile(filepath.Join(d, "cgroup.freeze"), []byte("0"), 0)
	}
}

// freezeNew freezes a new exec cgroup dir while the box is frozen.
func (s *Server) freezeNew(dir string) {
	s.fr.mu.Lock()
	defer s.fr.mu.Unlock()
	if s.fr.frozen {
		os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("1"), 0)
	}
}

// execCgroups lists the exec cgroups (CgroupRoot/exec-N).
func (s *Server) execCgroups() []string {
	ents, err := os.ReadDir(s.cfg.CgroupRoot)
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), "exec-") {
			dirs = append(dirs, filepath.Join(s.cfg.CgroupRoot, e.Name()))
		}
	}
	return dirs
}

// frozen reports whether the cgroup dir is frozen (cgroup.events), or
// gone.
func frozen(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return err != nil || bytes.Contains(b, []byte("frozen 1"))
}
