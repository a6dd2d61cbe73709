//go:build linux

package agent

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// startProcess starts bin as os.StartProcess does. For a user other than
// root (uid != 0, from attr.Sys.Credential) the process starts with
// no_new_privs, an empty capability bounding set and no inheritable or
// ambient capabilities: a setuid-root or file-capability binary in the
// image then runs with the user's own credentials and cannot lift the
// user back to box root (exec -u).
//
// The mechanism: syscall.SysProcAttr has no field for either setting, but
// both are attributes of the calling thread that a forked child inherits,
// and Go forks (clone with CLONE_VFORK) on the thread of the goroutine
// that starts the process. So the start runs on a goroutine locked to its
// OS thread that sets both on that thread first, and ends without
// unlocking it: Go then ends that thread (the main thread it parks for
// good), so no other goroutine ever runs with the reduced privileges. Go
// makes no new thread from a thread locked this way either (its template
// thread does), so the agent's other threads keep theirs. The child keeps
// the agent's effective capabilities until its own setuid (Credential)
// clears them: it needs them for the chroot, setgroups and setgid.
func startProcess(uid int, bin string, argv []string, attr *os.ProcAttr) (*os.Process, error) {
	if uid == 0 {
		return os.StartProcess(bin, argv, attr)
	}
	type result struct {
		p   *os.Process
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := restrictThread(); err != nil {
			ch <- result{nil, err}
			return
		}
		p, err := os.StartProcess(bin, argv, attr)
		ch <- result{p, err}
	}()
	r := <-ch
	return r.p, r.err
}

// restrictThread sets no_new_privs on the calling thread, empties its
// bounding set and its inheritable and ambient capabilities, and keeps its
// permitted and effective ones. As root every step must succeed; an agent
// that is not root (the fake driver's, a host process) cannot change the
// bounding set and keeps no_new_privs alone.
func restrictThread() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if os.Geteuid() != 0 {
		return nil
	}
	for c := 0; c < 64; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL {
			break // past the kernel's last capability
		}
		if err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop inheritable capabilities: %w", err)
	}
	return nil
}
