package airlock

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// Files in a box directory that confinement keeps.
const (
	fileSecret = "secret"   // the agent secret of the current boot (0600)
	fileUID    = "qemu.uid" // the uid QEMU runs as (root only)
	fileCgroup = "cgroup"   // QEMU's cgroup directories
	secretLen  = 32         // random bytes, hex in the file
	envConfine = "AIRLOCK_CONFINE"
)

// ConfinementOff reports whether AIRLOCK_CONFINE=off (or 0, false) asks
// for unconfined QEMU (benchmarks, debugging); confinement is on by
// default (see docs/confinement.md).
func ConfinementOff() bool {
	v := strings.ToLower(os.Getenv(envConfine))
	return v == "off" || v == "0" || v == "false"
}

// confine fills in qc's confinement for one boot of b (see qemu.Jail and
// docs/confinement.md): a fresh agent secret, and unless AIRLOCK_CONFINE
// is off, the jail, a uid of its own when airlock runs as root, and a
// cgroup with the box's limits where the host allows one.
func (b *Box) confine(qc *qemu.Config) error {
	secret := make([]byte, secretLen)
	rand.Read(secret)
	hexSecret := []byte(hex.EncodeToString(secret))
	if err := os.WriteFile(filepath.Join(b.dir, fileSecret), hexSecret, 0o600); err != nil {
		return fmt.Errorf("box secret: %w", err)
	}
	qc.Secret = hexSecret
	os.Remove(filepath.Join(b.dir, fileUID))
	if ConfinementOff() {
		qc.Jail.Off = true
		return nil
	}
	qc.Jail.HostNetwork = qc.Network // slirp needs the host's network namespace
	if v := os.Getenv("AIRLOCK_CONSOLE_MAX"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 4096 {
			return fmt.Errorf("AIRLOCK_CONSOLE_MAX=%q: want the console log's cap in bytes, 4096 or more", v)
		}
		qc.ConsoleMax = n
	}
	if os.Geteuid() != 0 {
		return nil
	}
	r, err := qemu.BoxUIDRange()
	if err != nil {
		return err
	}
	uid, err := qemu.AllocUID(r)
	if err != nil {
		return err
	}
	qc.Jail.UID, qc.Jail.GID = uid, uid
	if qc.Accel == qemu.AccelKVM {
		if g := qemu.KVMGroup(); g > 0 {
			qc.Jail.Groups = []int{g}
		}
	}
	os.WriteFile(filepath.Join(b.dir, fileUID), []byte(strconv.Itoa(uid)+"\n"), 0o600)
	qemu.RemoveSavedCgroup(filepath.Join(b.dir, fileCgroup))
	o := b.cfg.Options
	lim := qemu.Limits{
		MemoryBytes: int64(o.MemoryMiB+qemu.MemoryOverheadMiB(qc.Accel)) << 20,
		Pids:        qemu.PidsLimit(o.CPUs),
	}
	if v := os.Getenv("AIRLOCK_CPU_LIMIT"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			return fmt.Errorf("AIRLOCK_CPU_LIMIT=%q: want a number of host CPUs, e.g. 1.5", v)
		}
		lim.CPUs = f
	}
	g, err := qemu.NewCgroup("box-"+b.id, lim)
	if err != nil {
		b.r.warn("airlock: warning: boxes run without a cgroup: " + err.Error())
		return nil
	}
	qc.Jail.Cgroup = g
	qemu.SaveCgroup(filepath.Join(b.dir, fileCgroup), g)
	return nil
}

// boxSecret returns the agent secret of the box's current boot (nil when
// the box has none: booted by an airlock without agent authentication).
func (b *Box) boxSecret() []byte {
	s, err := os.ReadFile(filepath.Join(b.dir, fileSecret))
	if err != nil {
		return nil
	}
	return []byte(strings.TrimSpace(string(s)))
}

// vmGone releases what a boot of the box held on the host once its QEMU
// has exited: its cgroup.
func (b *Box) vmGone() {
	qemu.RemoveSavedCgroup(filepath.Join(b.dir, fileCgroup))
}
