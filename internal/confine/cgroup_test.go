package confine

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A box joins the cpu controller only when it has a CPU limit: without
// one the cpu cgroup would only make every box of the host one task to
// the scheduler (see NewCgroup).
func TestCgroupCPUOnlyWithALimit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root")
	}
	s := ProbeCgroups()
	if _, ok := s.V1["cpu"]; !ok {
		t.Skip("no cgroup v1 cpu hierarchy on this host")
	}
	inCPU := func(g *Cgroup) string {
		for _, d := range g.Dirs {
			if strings.HasPrefix(d, s.V1["cpu"]+"/") {
				return d
			}
		}
		return ""
	}
	g, err := NewCgroup("test-nocpu-"+filepath.Base(t.TempDir()), Limits{MemoryBytes: 512 << 20, Pids: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	if d := inCPU(g); d != "" {
		t.Errorf("no CPU limit, yet a cpu cgroup %s", d)
	}
	if len(g.Dirs) == 0 {
		t.Error("no cgroup directories")
	}
	g2, err := NewCgroup("test-cpu-"+filepath.Base(t.TempDir()), Limits{MemoryBytes: 512 << 20, Pids: 64, CPUs: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Remove()
	d := inCPU(g2)
	if d == "" {
		t.Fatalf("CPU limit 1.5 but no cpu cgroup in %v", g2.Dirs)
	}
	if q, _ := os.ReadFile(filepath.Join(d, "cpu.cfs_quota_us")); strings.TrimSpace(string(q)) != "150000" {
		t.Errorf("cpu.cfs_quota_us = %q, want 150000", q)
	}
}

// A cgroup removed between its making and Add (another process released
// the previous boot's cgroup of the same name) is made again, with its
// limits, and the process joins it.
func TestCgroupAddRemakesARemovedCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root")
	}
	name := "test-remade-" + filepath.Base(t.TempDir())
	g, err := NewCgroup(name, Limits{MemoryBytes: 256 << 20, Pids: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	// What a watcher of the previous boot does: the saved cgroup removed.
	file := filepath.Join(t.TempDir(), "cgroup")
	if err := SaveCgroup(file, g); err != nil {
		t.Fatal(err)
	}
	if err := RemoveSavedCgroup(file); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatalf("Add after the cgroup was removed: %v", err)
	}
	for _, d := range g.Dirs {
		procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if !strings.Contains(string(procs), strconv.Itoa(cmd.Process.Pid)) {
			t.Errorf("%s holds %q, not the pid %d", d, procs, cmd.Process.Pid)
		}
		if strings.Contains(d, "/pids/") || strings.HasSuffix(filepath.Dir(filepath.Dir(d)), "pids") {
			if m, _ := os.ReadFile(filepath.Join(d, "pids.max")); strings.TrimSpace(string(m)) != "32" {
				t.Errorf("%s: pids.max %q, want the limit again", d, m)
			}
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
}
