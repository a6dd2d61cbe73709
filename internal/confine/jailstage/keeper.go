package jailstage

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// KeeperArg0 (with Env=1) marks a re-execution as a keeper (see Keep):
// its lease pipe is descriptor 3.
const KeeperArg0 = "airlock-keeper"

// Keep is a keeper's work: it reads lines from lease, a pipe whose write
// end only its starter holds, "w PID START" to watch a process (START its
// start time, /proc/PID/stat field 22, so that a reused pid is not taken
// for it) and "r PID START" to let it go, and when the pipe hangs up (the
// starter closed it, or died) kills every process still watched
// (SIGKILL through a pidfd). It is how a machine that must not outlive
// the process that made it, yet may be handed on later, ends with that
// process: a parent-death signal cannot be taken back.
func Keep(lease *os.File) {
	type proc struct {
		fd    int
		start string
	}
	watched := map[int]proc{}
	sc := bufio.NewScanner(lease)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 {
			continue
		}
		if p, ok := watched[pid]; ok && p.start == f[2] {
			unix.Close(p.fd)
			delete(watched, pid)
		}
		if f[0] != "w" {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // already gone
		}
		// Checked after the pidfd is open: the pid names that process
		// from here on.
		if procStart(pid) != f[2] {
			unix.Close(fd)
			continue
		}
		if p, ok := watched[pid]; ok {
			unix.Close(p.fd) // a process that ended, its pid reused
		}
		watched[pid] = proc{fd, f[2]}
	}
	for _, p := range watched {
		unix.PidfdSendSignal(p.fd, unix.SIGKILL, nil, 0)
	}
}

// procStart returns field 22 of /proc/PID/stat (the start time), "" when
// the process is gone or a zombie.
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return f[19]
}
