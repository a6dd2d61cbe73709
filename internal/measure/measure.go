// Package measure holds the small statistics and process readings that
// benchmarks share: medians and /proc/PID/status fields.
package measure

import (
	"os"
	"slices"
	"strconv"
	"strings"
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
