package airlock

import (
	"os"
	"path/filepath"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// Limits of a network helper's cgroup (as root): its memory (gVisor's
// stack, the flows' buffers) and its threads. A hostile guest that opens
// many connections hits these instead of growing host memory.
const (
	netHelperMemory = 512 << 20
	netHelperPids   = 256
)

// netHelperUID returns the uid (and gid, the same number) the box's network
// helper runs as once it is set up: one of the box uid range that no other
// process runs as (see qemu.AllocUID), when airlock runs as root and
// confines its boxes; else 0 (the helper keeps the caller's uid).
func (b *Box) netHelperUID() (int, error) {
	if b.r.opts.Unconfined || os.Geteuid() != 0 {
		return 0, nil
	}
	r, err := qemu.BoxUIDRange(b.r.opts.UIDRange)
	if err != nil {
		return 0, err
	}
	return qemu.AllocUID(r)
}

// netCgroup puts the network helper pid in a cgroup of its own with the
// helper's limits (as root, where the host has cgroups), recorded in the
// box directory for stopNetIn.
func (b *Box) netCgroup(pid int) {
	if b.r.opts.Unconfined || os.Geteuid() != 0 {
		return
	}
	g, err := qemu.NewCgroup("net-"+b.id, qemu.Limits{MemoryBytes: netHelperMemory, Pids: netHelperPids})
	if err != nil {
		b.r.warn("network helpers run without a cgroup: " + err.Error())
		return
	}
	if err := g.Add(pid); err != nil {
		g.Remove()
		return
	}
	qemu.SaveCgroup(filepath.Join(b.dir, boxdir.NetCgroup), g)
}

// removeNetCgroup removes the cgroup of the box in dir's network helper,
// once the helper has ended.
func removeNetCgroup(dir string) { qemu.RemoveSavedCgroup(filepath.Join(dir, boxdir.NetCgroup)) }
