package airlock

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// shortSockBase is where a box's unix sockets go when its directory's path
// is too long for a socket address: a directory of this user's in the
// system temp dir, /tmp/airlock-<euid>, with one directory per box.
func shortSockBase() string {
	return filepath.Join(os.TempDir(), "airlock-"+strconv.Itoa(os.Geteuid()))
}

// shortSockDir makes (or checks) the short socket directory of box id and
// returns it. Each level is created 0700, or, if it already exists, must
// be a real directory owned by this user that no one else can enter: in a
// shared /tmp another user could have made it first, to receive the box's
// QMP and agent sockets.
func shortSockDir(id string) (string, error) {
	base := shortSockBase()
	if err := privateDir(base); err != nil {
		return "", err
	}
	d := filepath.Join(base, id)
	return d, privateDir(d)
}

// privateDir creates dir with mode 0700, or checks that the existing dir is
// a directory (not a symlink) owned by the effective user with no access
// for group or others.
func privateDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err == nil || !os.IsExist(err) {
		if err != nil {
			return fmt.Errorf("socket directory %s: %w", dir, err)
		}
		return nil
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

// checkSockDir makes sure the box's sockets can be created where sockPath
// puts them.
func (b *Box) checkSockDir() error {
	if len(filepath.Join(b.dir, fileQMP)) < 100 && len(filepath.Join(b.dir, agentSock(agentPorts-1))) < 100 {
		return nil
	}
	_, err := shortSockDir(b.id)
	return err
}
