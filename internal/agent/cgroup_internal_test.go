//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// An exec's cgroup with nothing left in it becomes the spare, with its
// oom_kill count as the next exec's start (so the next exec is not told
// of this one's OOM kills); one with processes left is not reused.
func TestRecycleCgroupKeepsAnEmptyOne(t *testing.T) {
	s := &Server{}
	empty := t.TempDir()
	os.WriteFile(filepath.Join(empty, "cgroup.events"), []byte("populated 0\nfrozen 0\n"), 0o644)
	s.recycleCgroup(&process{cgroup: empty}, 3)
	dir, ooms := s.takeCgroup()
	if dir != empty || ooms != 3 {
		t.Fatalf("takeCgroup after an empty exec cgroup: %q, %d; want %q, 3", dir, ooms, empty)
	}
	busy := t.TempDir()
	os.WriteFile(filepath.Join(busy, "cgroup.events"), []byte("populated 1\nfrozen 0\n"), 0o644)
	s.recycleCgroup(&process{cgroup: busy}, 0)
	if dir, _ := s.takeCgroup(); dir != "" {
		t.Fatalf("a cgroup with processes left became the spare: %q", dir)
	}
	// A spare already there: the ended exec's cgroup is not kept beside it.
	s.spareCgroup = "/spare"
	s.recycleCgroup(&process{cgroup: empty}, 0)
	if dir, _ := s.takeCgroup(); dir != "/spare" {
		t.Fatalf("spare %q, want the one there before", dir)
	}
}
