// Package boxdir names the files in a box directory (Home/boxes/<id>/), the
// one place both the lifecycle code and the VM drivers take them from. See
// docs/architecture.md for who writes which.
package boxdir

import (
	"fmt"
	"os"
	"path/filepath"
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

	// Confinement of a QEMU box (see docs/confinement.md).
	Secret    = "secret"         // the agent secret of the current boot (0600, hex)
	UID       = "qemu.uid"       // the uid the box's QEMU runs as (root only)
	Cgroup    = "cgroup"         // the box QEMU's cgroup directories, one a line
	Jail      = "jail"           // empty mount point of QEMU's jail root
	QEMUExit  = "qemu.exit"      // how a confined QEMU ended, when not with status 0
	NoMigrate = "nomigrate.qcow" // migration blocker image (unprivileged launch)
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
// socket, in a short directory under the system temp dir (see ShortDir).
func SockPath(dir, id, name string) string {
	p := filepath.Join(dir, name)
	if len(p) < maxSockPath {
		return p
	}
	d := ShortDir(id)
	os.MkdirAll(d, 0o700)
	return filepath.Join(d, name)
}

// ShortDir is the directory of box id's sockets when its box directory's
// path is too long for them; Remove deletes it with the box.
func ShortDir(id string) string { return filepath.Join(os.TempDir(), "airlock-"+id) }
