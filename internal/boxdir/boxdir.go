// Package boxdir names the files in a box directory (Home/boxes/<id>/), the
// one place both the lifecycle code and the VM drivers take them from. See
// docs/architecture.md for who writes which.
package boxdir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/gofrs/flock"
)

// Files of a box directory.
const (
	RW      = "rw.ext4"     // writable layer (ext4), survives Stop/Start
	Console = "console.log" // serial console of the current boot
	PID     = "qemu.pid"    // QEMU's pid file
	Lock    = "lock"        // flock held by Start, Stop and Remove
	QMP     = "qmp.sock"    // QEMU Machine Protocol socket
	CID     = "vsock.cid"   // guest CID when the box has a vsock device
	// FakeAgent is the unix socket of the fake driver's host-process agent.
	FakeAgent = "agent.sock"
	// Exit says how the last boot ended (airlock.ExitState as JSON).
	Exit = "exit.json"
	// Suspended holds the memory and device state of a box paused to disk
	// (airlock.Box.Suspend): its machine files, as a snapshot's.
	Suspended = "suspended"
	// The box's main command (internal/cli: run, run -d, create IMAGE
	// COMMAND): its output as JSON lines (MainLog, rotated to MainLog+".1"),
	// the detached command's spec, and the mark that it has ended.
	MainLog  = "main.log"
	MainSpec = "main.json"
	MainDone = "main.done"

	// The network helper (cmd/airlock-net) of a box with a network.
	NetPID     = "net.pid"          // its pid and start time
	NetConfig  = "net.json"         // its configuration
	NetStderr  = "net-helper.log"   // its own errors
	NetLog     = "network.log"      // denied attempts
	NetPorts   = "ports.json"       // published ports as bound at this start
	NetSock    = "net.sock"         // the machine's NIC listens here, the helper connects
	NetControl = "net-control.sock" // policy changes, counters
	NetCgroup  = "net.cgroup"       // its cgroup directories (root), one a line
	NetRoot    = "net-root"         // the empty directory it chroots into (root)
	// The box's secrets (BoxOptions.Secrets): their values and the box's
	// CA certificate and key (0600; never in a snapshot or an archive).
	Secrets = "secrets.json"

	// Confinement of a QEMU box (see docs/confinement.md).
	Secret    = "secret"           // the agent secret of the current boot (0600, hex)
	UID       = "qemu.uid"         // the uid the box's QEMU runs as (root only)
	Cgroup    = "cgroup"           // the box QEMU's cgroup directories, one a line
	Jail      = "jail"             // empty mount point of QEMU's jail root
	QEMUExit  = "qemu.exit"        // how a confined QEMU ended, when not with status 0
	NoMigrate = "nomigrate.qcow"   // migration blocker image (unprivileged launch)
	FSCgroup  = "virtiofsd.cgroup" // the virtio-fs daemons' cgroup directories (root), one a line

	// KernelStub is the kernel a restore hands QEMU: the notes of the
	// box's ELF kernel only (guest RAM, kernel included, comes from the
	// snapshot).
	KernelStub = "kernel-stub.elf"
)

// AgentSock is the unix socket of the agent's i-th virtio-serial port.
func AgentSock(i int) string { return fmt.Sprintf("agent-%d.sock", i) }

// AgentLock is the flock that reserves agent port i for one host connection.
func AgentLock(i int) string { return fmt.Sprintf("agent-%d.lock", i) }

// maxSockPath is the longest unix socket path that fits sockaddr_un (108
// bytes with the final NUL), with a margin.
const maxSockPath = 100

// SockPath returns where the unix socket name of box id (directory dir)
// lives: in the box directory, or, when that path is too long for a unix
// socket, in the box's private short directory under the system temp dir
// (ShortDir), which PrepareSockDir makes and checks before a boot.
func SockPath(dir, id, name string) string {
	p := filepath.Join(dir, name)
	if len(p) < maxSockPath {
		return p
	}
	return filepath.Join(ShortDir(id), name)
}

// ShortDir is the directory of box id's sockets when its box directory's
// path is too long for them: /tmp/airlock-<euid>/<id>. Remove deletes it
// with the box.
func ShortDir(id string) string { return filepath.Join(shortBase(), id) }

// shortBase is this user's directory of short socket directories.
func shortBase() string {
	return filepath.Join(os.TempDir(), "airlock-"+strconv.Itoa(os.Geteuid()))
}

// PrepareSockDir makes sure the sockets names of box id (directory dir)
// can be created where SockPath puts them: when any of them goes to the
// short directory, each level of it is created 0700, or, if it already
// exists, must be a real directory owned by this user that no one else can
// enter. In a shared /tmp another user could have made it first, to
// receive the box's QMP and agent sockets. Drivers call it before a boot.
func PrepareSockDir(dir, id string, names ...string) error {
	short := false
	for _, n := range names {
		short = short || len(filepath.Join(dir, n)) >= maxSockPath
	}
	if !short {
		return nil
	}
	if err := privateDir(shortBase()); err != nil {
		return err
	}
	return privateDir(ShortDir(id))
}

// privateDir creates dir with mode 0700, or checks that the existing dir is
// a directory (not a symlink) owned by the effective user with no access
// for group or others.
func privateDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if err == nil {
		return nil
	}
	if !os.IsExist(err) {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("socket directory %s is not a directory (a symlink?): remove it", dir)
	case !ok || int(st.Uid) != os.Geteuid():
		return fmt.Errorf("socket directory %s belongs to another user: remove it, or set TMPDIR to a private directory", dir)
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("socket directory %s is open to other users (mode %o): chmod 700 it or remove it", dir, fi.Mode().Perm())
	}
	return nil
}

// LockBox takes the lock of the box in dir (Lock), waiting within ctx;
// the func it returns releases it. Errors: ctx's when it ended first.
func LockBox(ctx context.Context, dir string) (func(), error) {
	fl := flock.New(filepath.Join(dir, Lock))
	ok, err := fl.TryLockContext(ctx, 20*time.Millisecond)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ctx.Err()
	}
	return func() { fl.Unlock() }, nil
}

// RemoveBox removes the box directory dir. A process of the box that is
// still ending (its VM, a helper) may write a last file while the
// directory goes: it tries again for about half a second.
func RemoveBox(dir string) error {
	err := os.RemoveAll(dir)
	for try := 0; err != nil && errors.Is(err, syscall.ENOTEMPTY) && try < 20; try++ {
		time.Sleep(25 * time.Millisecond)
		err = os.RemoveAll(dir)
	}
	return err
}
