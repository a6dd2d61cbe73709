// Package measure holds the small statistics and process readings that
// benchmarks share: medians and /proc/PID/status fields, and a process's
// CPU time and resident memory (Box.Stats).
package measure

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Median returns the median of v (the mean of the two middle values for an
// even count), or zero for an empty v. v is not changed.
func Median[T ~int64 | ~float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}

// ProcStatusKiB reads a "VmXXX:  N kB" field (VmRSS, VmHWM...) of
// /proc/PID/status, in KiB; 0 when the process or the field is missing.
func ProcStatusKiB(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field+":") {
			if f := strings.Fields(l); len(f) >= 2 {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				return v
			}
		}
	}
	return 0
}

// ProcUsage reads process pid's CPU time (utime + stime of
// /proc/PID/stat, in clock ticks of 10 ms: Linux's USER_HZ) and resident
// memory (VmRSS of /proc/PID/status, in bytes): Box.Stats's figures.
func ProcUsage(pid int) (cpu time.Duration, rss int64, err error) {
	if pid <= 0 {
		return 0, 0, fmt.Errorf("no VM process")
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("its VM process %d: %w", pid, err)
	}
	str := string(raw)
	i := strings.LastIndexByte(str, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("its VM process %d: /proc/%d/stat unreadable", pid, pid)
	}
	f := strings.Fields(str[i+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("its VM process %d: /proc/%d/stat unreadable", pid, pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	cpu = time.Duration(ut+stime) * 10 * time.Millisecond
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			rss = kb << 10
		}
	}
	return cpu, rss, nil
}
