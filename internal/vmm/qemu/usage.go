package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlock-run/airlock/internal/vmm"
)

var _ vmm.UsageReporter = (*Driver)(nil)

// Usage scans /proc for the QEMU processes of boxes (-name airlock-<id>,
// of every airlock home and user) other than box except's, and returns
// how many run and their guest memory (-m, MiB).
func (d *Driver) Usage(except string) vmm.Usage {
	var u vmm.Usage
	seen := map[string]bool{} // a machine counts once (a forked child has its command line)
	ents, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range ents {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("\x00-name\x00airlock-")) {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.Contains(filepath.Base(args[0]), "qemu") {
			continue
		}
		name, mem := "", 0
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-name":
				name = args[i+1]
			case "-m":
				mem, _ = strconv.Atoi(args[i+1])
			}
		}
		if name == "airlock-"+except || seen[name] {
			continue
		}
		seen[name] = true
		u.Machines++
		u.MemoryMiB += mem
	}
	return u
}
