//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Resource limits of each exec inside the guest, so that what a user runs
// (a fork bomb, a memory bomb) is stopped in its own cgroup and the agent
// keeps answering. Defaults when Config leaves them zero:
const (
	// DefaultExecPids is each exec's pids.max: processes and threads.
	// pip install and a 64-thread program stay far below it; a fork bomb
	// stops there.
	DefaultExecPids = 1024
	// agentReserveMin is guest memory that execs cannot take (the exec
	// memory.max is MemTotal minus this, or minus an eighth of MemTotal when
	// that is larger): the agent, the kernel and the page cache it needs.
	agentReserveMin = 48 << 20
	// agentMemoryMin is memory.min of the agent's own cgroup.
	agentMemoryMin = 32 << 20
)

// setupCgroups enables the memory and pids controllers for the execs'
// cgroups and moves the agent into its own cgroup with protected memory.
// Best effort: a kernel
// without a controller runs execs without that limit.
func (s *Server) setupCgroups() {
	root := s.cfg.CgroupRoot
	if root == "" {
		return
	}
	for _, c := range []string{"+memory", "+pids"} {
		os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte(c), 0)
	}
	if s.cfg.ReapAll {
		// Only the real guest agent (PID 1) moves itself; a test agent
		// on a host must not.
		dir := filepath.Join(root, "airlock-agent")
		if err := os.Mkdir(dir, 0o755); err == nil || os.IsExist(err) {
			os.WriteFile(filepath.Join(dir, "memory.min"), []byte(strconv.Itoa(agentMemoryMin)), 0)
			os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
		}
		go protectCPU()
		// No oom_score_adj: the OOM killer never picks PID 1, and a
		// negative value would be inherited by every process the agent
		// starts, leaving the OOM killer nothing to kill (a kernel panic).
	}
	if s.execMemMax == 0 {
		if total := memTotal(); total > 0 {
			s.execMemMax = total - max(agentReserveMin, total/8)
		}
	}
}

// memTotal returns the guest's MemTotal in bytes, 0 if unknown.
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// limitCgroup writes an exec's limits into its new cgroup dir.
func (s *Server) limitCgroup(dir string) {
	pids := s.cfg.ExecPids
	if pids == 0 {
		pids = DefaultExecPids
	}
	if pids > 0 {
		os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(pids)), 0)
	}
	if s.execMemMax > 0 {
		os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatInt(s.execMemMax, 10)), 0)
		// Swap would only make a memory bomb slower to stop.
		os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0)
	}
}

// oomKills returns the oom_kill count of a cgroup's memory.events: how many
// of its processes the OOM killer killed (also when the guest as a whole,
// not the cgroup's limit, ran out of memory).
func oomKills(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "memory.events"))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// limitsSummary describes the limits in effect, for the console log.
func (s *Server) limitsSummary() string {
	pids := s.cfg.ExecPids
	if pids == 0 {
		pids = DefaultExecPids
	}
	return fmt.Sprintf("exec limits: pids.max %d, memory.max %d MiB", pids, s.execMemMax>>20)
}

// agentNice is the agent's nice value: under a fork bomb of thousands of
// runnable processes the agent must still get the CPU to answer keepalives
// and kill the exec at its timeout.
const agentNice = -15

// protectCPU gives every agent thread agentNice, with SCHED_RESET_ON_FORK so
// that the processes the agent starts (and their children) run at nice 0,
// and does it again within 2 s of the Go runtime starting a thread (a new
// thread starts at nice 0 too). The runtime's count of the threads it
// made tells when (it never drops: a thread ends only with a goroutine
// locked to it, which the agent has none of), at no system call: before,
// the 2-s pass that read /proc/self/task and set every thread again fell
// into a restored box's first exec every so often.
func protectCPU() {
	for seen := -1; ; time.Sleep(2 * time.Second) {
		n, _ := runtime.ThreadCreateProfile(nil)
		if n == seen {
			continue
		}
		seen = n
		if ents, err := os.ReadDir("/proc/self/task"); err == nil {
			for _, e := range ents {
				tid, err := strconv.Atoi(e.Name())
				if err != nil {
					continue
				}
				a := unix.SchedAttr{Policy: unix.SCHED_NORMAL, Flags: unix.SCHED_FLAG_RESET_ON_FORK, Nice: agentNice}
				unix.SchedSetAttr(tid, &a, 0)
			}
		}
	}
}
