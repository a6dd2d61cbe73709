// Package scratch makes temporary files and directories whose names say
// which process made them (its pid and start time), so that a later
// process can remove what a killed one left behind (Sweep) without
// touching the work of one still running.
package scratch

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/airlock-run/airlock/internal/vmm"
)

// Prefix starts every scratch name: Prefix, then "<pid>.<start time>.",
// then the caller's label and a random part.
const Prefix = ".scratch-"

// owner is this process's part of a scratch name.
var owner = func() string {
	pid := os.Getpid()
	return strconv.Itoa(pid) + "." + strconv.FormatUint(vmm.StartTime(pid), 10) + "."
}()

// MkdirTemp is os.MkdirTemp in dir with a name marked as this process's;
// label (no '/') says what it is for.
func MkdirTemp(dir, label string) (string, error) {
	return os.MkdirTemp(dir, Prefix+owner+label+"-")
}

// CreateTemp is os.CreateTemp in dir with a name marked as this process's,
// ending in suffix.
func CreateTemp(dir, label, suffix string) (*os.File, error) {
	return os.CreateTemp(dir, Prefix+owner+label+"-*"+suffix)
}

// Path returns a fresh path in dir marked as this process's, ending in
// suffix, for a file the caller creates (no two calls return the same).
func Path(dir, label, suffix string) string {
	n := seq.Add(1)
	return filepath.Join(dir, Prefix+owner+label+"-"+strconv.FormatInt(time.Now().UnixNano(), 36)+"-"+strconv.FormatInt(n, 36)+suffix)
}

var seq atomic.Int64

// Sweep removes the scratch entries of dir whose maker is gone (no
// process with that pid, or one with another start time: the pid was
// reused). Those of live processes, and names it cannot read, are left.
// It returns the paths it removed; a dir it cannot read has nothing to
// sweep.
func Sweep(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var gone []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), Prefix)
		if !ok {
			continue
		}
		f := strings.SplitN(rest, ".", 3)
		if len(f) < 3 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		start, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil || pid <= 0 || start == 0 || vmm.StartTime(pid) == start {
			continue // not readable, its maker's start unknown, or it runs
		}
		p := filepath.Join(dir, e.Name())
		if err := os.RemoveAll(p); err == nil {
			gone = append(gone, p)
		}
	}
	return gone
}
