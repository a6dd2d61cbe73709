package vmtest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/airlock-run/airlock/internal/boxdir"
)

// HomeProcesses returns the processes (pid: command line) that belong to
// the airlock home dir: those naming it on their command line (network
// helpers, console drainers, airlock itself) and the QEMU of each of its
// boxes (a confined QEMU names only jail paths).
func HomeProcesses(home string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if c, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(c), home) {
			out[pid] = strings.ReplaceAll(string(c), "\x00", " ")
		}
	}
	boxes, _ := filepath.Glob(filepath.Join(home, "boxes", "*", boxdir.PID))
	for _, f := range boxes {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.Fields(string(raw) + " 0")[0])
		if err != nil || pid <= 0 {
			continue
		}
		id := filepath.Base(filepath.Dir(f))
		if c, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); err == nil && strings.Contains(string(c), "airlock-"+id) {
			out[pid] = strings.ReplaceAll(string(c), "\x00", " ")
		}
	}
	return out
}

// KillHome kills every process of HomeProcesses(home): for a test's
// cleanup, so that a failed test leaves no VM of its home running.
func KillHome(home string) {
	for pid := range HomeProcesses(home) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
