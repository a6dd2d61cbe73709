package airlock

import (
	"github.com/airlock-run/airlock/internal/capacity"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Host-wide capacity: caps on the boxes running on this host (of every
// airlock home and user, as the VM driver counts them) and on the host
// memory they take (guest memory plus a per-box overhead for QEMU and its
// helpers), checked when a box is created and when it starts. The
// arithmetic is internal/capacity's.

// DefaultMaxBoxes is the default cap on running boxes (Options.MaxBoxes).
const DefaultMaxBoxes = capacity.DefaultMaxBoxes

// CapacityError is returned when starting a box would exceed a host-wide
// cap; it names the cap.
type CapacityError struct {
	Cap    string // "AIRLOCK_MAX_BOXES" (Options.MaxBoxes) or "AIRLOCK_MAX_MEMORY" (Options.MaxMemoryMiB)
	Limit  int    // boxes, or MiB
	InUse  int    // boxes, or MiB of host memory of running boxes (guest memory plus a per-box overhead for QEMU and its helpers)
	Wanted int    // MiB of host memory this box takes (its memory plus the per-box overhead; memory cap), 1 for boxes
}

func (e *CapacityError) Error() string { return (*capacity.Exceeded)(e).Error() }

// capacityError is e as the public error (nil for nil): the same fields.
func capacityError(e *capacity.Exceeded) error {
	if e == nil {
		return nil
	}
	return (*CapacityError)(e)
}

// capacityLimits returns the caps: Options.MaxBoxes (default
// DefaultMaxBoxes) and Options.MaxMemoryMiB (default host RAM minus the
// larger of 2 GiB and 10%).
func (r *Runtime) capacityLimits() capacity.Limits {
	mem := r.opts.MaxMemoryMiB
	host := 0
	if mem <= 0 {
		host = capacity.HostMemMiB()
	}
	return capacity.Resolve(r.opts.MaxBoxes, mem, host)
}

// Capacity returns the host-wide caps this Runtime enforces: the most
// boxes that may run on the host (Options.MaxBoxes, default
// DefaultMaxBoxes) and the host memory, in MiB, that running boxes may take
// (Options.MaxMemoryMiB, default host RAM less the larger of 2 GiB and a
// tenth), each box counted with its memory plus the overhead of QEMU and its
// helpers. Schedulers that place boxes on hosts (airlock's Kubernetes node)
// report these.
func (r *Runtime) Capacity() (maxBoxes, memoryMiB int) {
	l := r.capacityLimits()
	return l.Boxes, l.MemoryMiB
}

// machineUsage counts the driver's running machines other than box
// except's; nil when the driver cannot count them (no vmm.UsageReporter).
func (r *Runtime) machineUsage(except string) *capacity.Usage {
	ur, ok := r.drv.(vmm.UsageReporter)
	if !ok {
		return nil
	}
	u := ur.Usage(except)
	return &capacity.Usage{Machines: u.Machines, MemoryMiB: u.MemoryMiB}
}

// checkCapacity returns a CapacityError if starting box id with memMiB of
// guest memory would pass a host-wide cap (each box counted with
// capacity.OverheadMiB). A driver that cannot count its machines (no
// vmm.UsageReporter) is held to the memory cap of one box.
func (r *Runtime) checkCapacity(id string, memMiB int) error {
	return r.caps(0).Check(id, memMiB, 0, 0)
}

// checkMemoryCap refuses, at creation, a box whose memory alone (with
// capacity.OverheadMiB) passes the host memory cap.
func (r *Runtime) checkMemoryCap(memMiB int) error {
	return capacityError(r.capacityLimits().Alone(memMiB))
}
