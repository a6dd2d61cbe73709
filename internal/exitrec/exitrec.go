// Package exitrec is the record of how a box's boot ended, kept in its
// box directory (boxdir.Exit): written once per boot (the first reason
// wins), read back only for the boot it describes. It also reads the
// guest's word on an OOM kill. The public ExitState and the decisions of
// when a boot ended, and why, are the root package's (exitstate.go).
package exitrec

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
)

// State is one boot's end, as stored (the public ExitState's fields).
type State struct {
	Reason   string    `json:"reason"`
	ExitCode int       `json:"exit_code"`
	Cause    string    `json:"cause,omitempty"`
	Finished time.Time `json:"finished"`
	// Boot is the start time of the boot it ends.
	Boot time.Time `json:"boot"`
}

// maxFile bounds what Read reads (the box directory is the host's, but a
// record of another size is not one Record wrote).
const maxFile = 64 << 10

// Read returns the recorded end of the boot of the box in dir that
// started at boot; false when none is recorded for that boot.
func Read(dir string, boot time.Time) (State, bool) {
	raw, err := os.ReadFile(filepath.Join(dir, boxdir.Exit))
	if err != nil || len(raw) > maxFile {
		return State{}, false
	}
	var s State
	if json.Unmarshal(raw, &s) != nil || !s.Boot.Equal(boot) {
		return State{}, false
	}
	return s, true
}

// Record records how the boot of the box in dir that started at boot
// ended, unless an end of that boot is recorded already: the first
// reason wins (a main command's exit, then the Stop that follows it, say
// "exited"). A zero boot (never booted) records nothing; a zero Finished
// is now. The file is replaced whole (renamed into place).
func Record(dir string, boot time.Time, s State) {
	if boot.IsZero() {
		return
	}
	if _, ok := Read(dir, boot); ok {
		return
	}
	s.Boot = boot
	if s.Finished.IsZero() {
		s.Finished = time.Now()
	}
	raw, _ := json.Marshal(s)
	p := filepath.Join(dir, boxdir.Exit)
	tmp := p + ".tmp"
	if os.WriteFile(tmp, raw, 0o600) == nil {
		os.Rename(tmp, p)
	}
}

// OOMKilled reports whether the guest's OOM killer has killed a process
// in this boot: its oom_kill counter (/proc/vmstat), else its kernel log
// (dmesg), as run (a command run in the box: its output) reads them, else
// what console (the end of the box's console log) says.
func OOMKilled(run func(cmd string, args ...string) (string, error), console func() string) bool {
	if out, err := run("cat", "/proc/vmstat"); err == nil {
		if killed, known := vmstatOOM(out); known {
			return killed
		}
	}
	// Kernels without VM event counters: the kernel log says it.
	if out, err := run("dmesg"); err == nil && logOOM(out) {
		return true
	}
	return consoleOOM(console())
}

// vmstatOOM reads the guest's /proc/vmstat: whether its oom_kill counter
// is above zero; known is false when the counter is not there (a kernel
// without VM event counters).
func vmstatOOM(vmstat string) (killed, known bool) {
	for _, l := range strings.Split(vmstat, "\n") {
		if n, ok := strings.CutPrefix(l, "oom_kill "); ok {
			return strings.TrimSpace(n) != "0", true
		}
	}
	return false, false
}

// logOOM reports whether the guest kernel's log (dmesg) says its OOM
// killer killed a process.
func logOOM(dmesg string) bool { return strings.Contains(dmesg, "Out of memory: Killed process") }

// consoleOOM reports whether a box's console log says so.
func consoleOOM(console string) bool {
	return strings.Contains(console, "Out of memory") || strings.Contains(console, "oom-kill")
}
