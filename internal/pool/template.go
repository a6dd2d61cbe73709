package pool

import (
	"fmt"
	"strconv"
	"strings"
)

// TemplatePrefix starts the names of template snapshots:
// pool-KEY-PID-START-RAND, PID and START naming the process that made it
// (a template whose process is gone was left by a crash: TemplateOwner).
const TemplatePrefix = "pool-"

// TemplateName is the name of a template snapshot of the pool of key
// (its first 8 characters), made by process pid started at start, rnd
// making it unique.
func TemplateName(key string, pid int, start uint64, rnd string) string {
	return fmt.Sprintf("%s%s-%d-%d-%s", TemplatePrefix, key[:min(len(key), 8)], pid, start, rnd)
}

// TemplateOwner returns the process that made template snapshot name
// (TemplateName); ok is false when name is not a template's.
func TemplateOwner(name string) (pid int, start uint64, ok bool) {
	rest, found := strings.CutPrefix(name, TemplatePrefix)
	f := strings.Split(rest, "-")
	if !found || len(f) != 4 {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return pid, start, true
}
