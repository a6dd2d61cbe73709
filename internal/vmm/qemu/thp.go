package qemu

import (
	"os/exec"
	"sync"

	"golang.org/x/sys/unix"
)

// thpMu serializes starts that switch transparent huge pages off: the
// setting is per process, so two overlapping starts must not undo each
// other's.
var thpMu sync.Mutex

// startWithoutTHP starts cmd with transparent huge pages disabled for it
// (prctl PR_SET_THP_DISABLE, which a child inherits across fork and execve);
// see THPNone.
//
// The flag is set on the calling process only for the duration of
// cmd.Start (and restored to what it was); a child another goroutine
// starts in that window inherits it too, which only costs it huge pages.
func startWithoutTHP(cmd *exec.Cmd) error {
	thpMu.Lock()
	defer thpMu.Unlock()
	prev, err := unix.PrctlRetInt(unix.PR_GET_THP_DISABLE, 0, 0, 0, 0)
	if err != nil || prev != 0 {
		// Unsupported, or already off for this process: nothing to switch.
		return cmd.Start()
	}
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		return cmd.Start()
	}
	defer unix.Prctl(unix.PR_SET_THP_DISABLE, 0, 0, 0, 0)
	return cmd.Start()
}
