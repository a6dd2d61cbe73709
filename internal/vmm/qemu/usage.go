package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/vmm"
)

var _ vmm.UsageReporter = (*Driver)(nil)

// Usage scans /proc for the QEMU processes of boxes (-name airlock-<id>,
// of every airlock home and user) other than box except's, and returns
// how many run and their guest memory (-m, MiB).
//
// Every box start runs it: a process whose executable (/proc/PID/exe) it
// can read and whose file name has no "qemu" in it is passed over without
// reading its command line, which takes more system calls and, for a
// large process, a walk of its memory.
func (d *Driver) Usage(except string) vmm.Usage {
	var u vmm.Usage
	seen := map[string]bool{} // a machine counts once (a forked child has its command line)
	dir, err := os.Open("/proc")
	if err != nil {
		return u
	}
	names, _ := dir.Readdirnames(-1)
	dir.Close()
	link := make([]byte, 4096)
	for _, pid := range names {
		if pid == "" || pid[0] < '0' || pid[0] > '9' {
			continue
		}
		// The link is unreadable for other users' processes (without
		// CAP_SYS_PTRACE) and kernel threads: read their command line.
		if n, err := unix.Readlink("/proc/"+pid+"/exe", link); err == nil && n < len(link) && !strings.Contains(filepath.Base(string(link[:n])), "qemu") {
			continue
		}
		b, err := os.ReadFile("/proc/" + pid + "/cmdline")
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
