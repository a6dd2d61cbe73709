package qemu

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/confine"
	"github.com/airlock-run/airlock/internal/vmm"
)

// JailOptions configure how the driver confines box QEMUs (see Jail and
// docs/confinement.md). The zero value confines as far as this process's
// privileges allow, with the defaults.
type JailOptions struct {
	// Off starts QEMU unconfined (Jail.Off); the agent secret stays.
	Off bool
	// ConsoleMax caps a confined box's console log in bytes (0:
	// DefaultConsoleMax).
	ConsoleMax int64
	// CPULimit is how many host CPUs one box's QEMU may use (cgroup, as
	// root; 0: no limit).
	CPULimit float64
	// UIDRange is "START:COUNT" of the uids box QEMUs run as when this
	// process is root ("": the UIDRangeOwner entry of /etc/subuid).
	UIDRange string
	// TestWithout is TEST-ONLY: layers of the confinement left out, so
	// that a benchmark can measure what each one costs
	// (BenchmarkConfinementLayers). Nothing a user configures reaches it.
	TestWithout []Layer
}

// Layer names a part of the confinement (JailOptions.TestWithout).
type Layer string

// The layers of the confinement a benchmark may leave out.
const (
	// LayerSeccomp is QEMU's -sandbox filter.
	LayerSeccomp Layer = "seccomp"
	// LayerCgroup is the box's cgroup (memory, pids, cpu).
	LayerCgroup Layer = "cgroup"
	// LayerUID is the box's own uid (QEMU stays root in its jail).
	LayerUID Layer = "uid"
	// LayerNetNS is the box's empty network namespace.
	LayerNetNS Layer = "netns"
	// LayerJail is the namespaces and the pivot into the jail root, and
	// with them the box's uid, which could not reach the box's files
	// outside the jail (QEMU runs as root and sees the host's file system;
	// seccomp and the cgroup stay).
	LayerJail Layer = "jail"
)

func (o JailOptions) without(l Layer) bool {
	for _, x := range o.TestWithout {
		if x == l {
			return true
		}
	}
	return false
}

// secretLen is the agent secret's length in random bytes (hex in the file).
const secretLen = 32

// confine fills in qc's confinement for one boot of spec's box (see Jail
// and docs/confinement.md): a fresh agent secret, and unless confinement
// is off, the jail, a uid of its own when this process is root, and a
// cgroup with the box's limits where the host allows one.
func (d *Driver) confine(spec vmm.Spec, qc *Config) error {
	secret := make([]byte, secretLen)
	rand.Read(secret)
	hexSecret := []byte(hex.EncodeToString(secret))
	if err := os.WriteFile(filepath.Join(spec.Dir, boxdir.Secret), hexSecret, 0o600); err != nil {
		return fmt.Errorf("box secret: %w", err)
	}
	qc.Secret = hexSecret
	os.Remove(filepath.Join(spec.Dir, boxdir.UID))
	o := d.o.Jail
	if o.Off {
		qc.Jail.Off = true
		return nil
	}
	// Only QEMU's own user-mode networking (slirp, benchmarks) needs the
	// host's network namespace; the network helper's stream netdev is a
	// descriptor, which works from the box's own empty one.
	qc.Jail.HostNetwork = qc.Network && qc.NetSocket == "" || o.without(LayerNetNS)
	qc.Jail.NoSeccomp = o.without(LayerSeccomp)
	qc.Jail.NoPivot = o.without(LayerJail)
	qc.Jail.DieWithCaller = spec.DieWithCaller
	qc.ConsoleMax = o.ConsoleMax
	if os.Geteuid() != 0 {
		return nil
	}
	// The cgroup is made while the uid is chosen (both write to the
	// host's file systems; neither needs the other).
	type made struct {
		g   *confine.Cgroup
		err error
	}
	cg := make(chan made, 1)
	go func() {
		release(spec.Dir)
		if o.without(LayerCgroup) {
			cg <- made{}
			return
		}
		g, err := confine.NewCgroup("box-"+spec.ID, confine.Limits{
			MemoryBytes: int64(spec.MemoryMiB+MemoryOverheadMiB(qc.Accel)) << 20,
			Pids:        PidsLimit(spec.CPUs),
			CPUs:        o.CPULimit,
		})
		cg <- made{g, err}
	}()
	if !o.without(LayerUID) && !o.without(LayerJail) {
		uid, err := confine.AllocBoxUID(o.UIDRange)
		if err != nil {
			if m := <-cg; m.g != nil {
				m.g.Remove()
			}
			return err
		}
		qc.Jail.UID, qc.Jail.GID = uid, uid
		if qc.Accel == AccelKVM {
			if g := KVMGroup(); g > 0 {
				qc.Jail.Groups = []int{g}
			}
		}
		os.WriteFile(filepath.Join(spec.Dir, boxdir.UID), []byte(strconv.Itoa(uid)+"\n"), 0o600)
	}
	m := <-cg
	if m.err != nil {
		d.warn("airlock: warning: boxes run without a cgroup: " + m.err.Error())
		return nil
	}
	g := m.g
	if g == nil {
		return nil
	}
	qc.Jail.Cgroup = g
	confine.SaveCgroup(filepath.Join(spec.Dir, boxdir.Cgroup), g)
	return nil
}

// MemoryOverheadMiB is what a box's QEMU may use on top of the guest's RAM
// before its cgroup's memory limit stops it: under TCG the translated-code
// buffer and its tables (QEMU 7.2 reserves up to 1 GiB, used as code is
// translated; here ~30-60 MiB), device state and I/O buffers. An idle
// airlock-kernel box used ~115-140 MiB in total for 512 MiB of RAM.
func MemoryOverheadMiB(accel string) int {
	if accel == AccelKVM {
		return 128
	}
	return 384
}

// PidsLimit is the thread cap of a box's QEMU with cpus vCPUs: its main
// loop, RCU and vCPU threads and up to 64 block I/O workers.
func PidsLimit(cpus int) int { return 128 + 2*cpus }

// KVMGroup returns the group that owns /dev/kvm (-1 if none).
func KVMGroup() int {
	var st syscall.Stat_t
	if syscall.Stat("/dev/kvm", &st) != nil {
		return -1
	}
	return int(st.Gid)
}

// boxSecret returns the agent secret of the current boot of the box in dir
// (nil when it has none: booted by an airlock without agent
// authentication).
func boxSecret(dir string) []byte {
	s, err := os.ReadFile(filepath.Join(dir, boxdir.Secret))
	if err != nil {
		return nil
	}
	return []byte(strings.TrimSpace(string(s)))
}

// release frees what a boot of the box in dir held on the host once its
// QEMU has exited: its cgroup, and its virtio-fs daemons (which end by
// themselves when QEMU closes their sockets) and their cgroup.
func release(dir string) {
	releaseShares(dir)
	confine.RemoveSavedCgroup(filepath.Join(dir, boxdir.Cgroup))
}
