package airlock

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/airlock-run/airlock/internal/vmm"
)

// Host-wide capacity: caps on the boxes running on this host (of every
// airlock home and user, as the VM driver counts them) and on the host
// memory they take (guest memory plus a per-box overhead for QEMU and its
// helpers), checked when a box is created and when it starts.
const (
	// DefaultMaxBoxes is the default cap on running boxes
	// (Options.MaxBoxes).
	DefaultMaxBoxes = 128
	// memoryReserveMiB is host RAM kept out of the default memory cap:
	// the larger of this and a tenth of RAM.
	memoryReserveMiB = 2048
	// boxOverheadMiB is the host memory a running box takes besides its
	// guest RAM, counted against the memory cap (Options.MaxMemoryMiB)
	// with each box's memory: QEMU's own (heap, device state, I/O
	// buffers, and under TCG the translated-code buffer), the box's
	// network helper, its console drain and the virtiofsd processes of
	// its shared directories. Measured from /proc/PID/smaps of an idle
	// 512 MiB box under TCG after one exec (airlock kernel; Debian's in
	// brackets): QEMU 118 [268] MiB RSS, of which 31 [114] MiB guest RAM,
	// 33 [56] MiB translated code, 20 [25] MiB other anonymous memory
	// and 35 [73] MiB file pages (binary and libraries, shared between
	// boxes); network helper 9.3 MiB; console drain 1.5 MiB of its own
	// (10.5 MiB PSS); virtiofsd 3-3.6 MiB RSS, ~1 MiB PSS, for each of
	// its two processes. That is 65-100 MiB a box beyond guest RAM. The
	// translated code grows with the code the guest runs (QEMU reserves
	// 1 GiB for it): after python3 imported ten modules and ran a loop,
	// 64 MiB, with 25 MiB other anonymous memory (~100 MiB a box, 135
	// with the file pages of a lone QEMU). Under KVM there is none. 128
	// MiB covers TCG with some room.
	boxOverheadMiB = 128
)

// hostMiB is the host memory a box of guestMiB takes for the caps.
func hostMiB(guestMiB int) int { return guestMiB + boxOverheadMiB }

// usageMiB is the host memory that the machines u counts take for the
// caps.
func usageMiB(u vmm.Usage) int { return u.MemoryMiB + u.Machines*boxOverheadMiB }

// CapacityError is returned when starting a box would exceed a host-wide
// cap; it names the cap.
type CapacityError struct {
	Cap    string // "AIRLOCK_MAX_BOXES" (Options.MaxBoxes) or "AIRLOCK_MAX_MEMORY" (Options.MaxMemoryMiB)
	Limit  int    // boxes, or MiB
	InUse  int    // boxes, or MiB of host memory of running boxes (guest memory plus a per-box overhead for QEMU and its helpers)
	Wanted int    // MiB of host memory this box takes (its memory plus the per-box overhead; memory cap), 1 for boxes
}

func (e *CapacityError) Error() string {
	if e.Cap == "AIRLOCK_MAX_BOXES" {
		return fmt.Sprintf("host capacity: %d boxes already run on this host, the cap is %d (Options.MaxBoxes, or AIRLOCK_MAX_BOXES=N)", e.InUse, e.Limit)
	}
	if e.InUse == 0 {
		return fmt.Sprintf("host capacity: the box takes %d MiB of host memory (its memory and %d MiB for QEMU, its network helper and virtiofsd), more than the host cap of %d MiB (Options.MaxMemoryMiB, or AIRLOCK_MAX_MEMORY=MiB; default host RAM minus a reserve)", e.Wanted, boxOverheadMiB, e.Limit)
	}
	return fmt.Sprintf("host capacity: running boxes take %d MiB of host memory, %d MiB more (the box's memory and %d MiB for QEMU, its network helper and virtiofsd) would pass the cap of %d MiB (Options.MaxMemoryMiB, or AIRLOCK_MAX_MEMORY=MiB)", e.InUse, e.Wanted, boxOverheadMiB, e.Limit)
}

// capacityLimits returns the caps: Options.MaxBoxes (default
// DefaultMaxBoxes) and Options.MaxMemoryMiB (default host RAM minus the
// larger of 2 GiB and 10%).
func (r *Runtime) capacityLimits() (boxes, memMiB int) {
	boxes, memMiB = r.opts.MaxBoxes, r.opts.MaxMemoryMiB
	if boxes <= 0 {
		boxes = DefaultMaxBoxes
	}
	if memMiB <= 0 {
		total := hostMemMiB()
		if total == 0 {
			memMiB = 1 << 30
		} else {
			memMiB = total - max(memoryReserveMiB, total/10)
		}
	}
	return boxes, memMiB
}

// Capacity returns the host-wide caps this Runtime enforces: the most
// boxes that may run on the host (Options.MaxBoxes, default
// DefaultMaxBoxes) and the host memory, in MiB, that running boxes may take
// (Options.MaxMemoryMiB, default host RAM less the larger of 2 GiB and a
// tenth), each box counted with its memory plus the overhead of QEMU and its
// helpers. Schedulers
// that place boxes on hosts (airlock's Kubernetes node) report these.
func (r *Runtime) Capacity() (maxBoxes, memoryMiB int) { return r.capacityLimits() }

// hostMemMiB returns MemTotal from /proc/meminfo in MiB (0 if unknown).
func hostMemMiB() int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb / 1024
		}
	}
	return 0
}

// checkCapacity returns a CapacityError if starting box id with memMiB of
// guest memory would pass a host-wide cap (each box counted with
// boxOverheadMiB). A driver that cannot count its machines (no
// vmm.UsageReporter) is held to the memory cap of one box.
func (r *Runtime) checkCapacity(id string, memMiB int) error {
	return r.checkCapacityWith(id, memMiB, 0, 0)
}

// checkCapacityWith is checkCapacity with pending more machines of
// pendingMiB guest memory starting (not yet counted by the driver)
// besides.
func (r *Runtime) checkCapacityWith(id string, memMiB, pending, pendingMiB int) error {
	maxBoxes, maxMem := r.capacityLimits()
	want := hostMiB(memMiB)
	if want > maxMem {
		return &CapacityError{Cap: "AIRLOCK_MAX_MEMORY", Limit: maxMem, Wanted: want}
	}
	ur, ok := r.drv.(vmm.UsageReporter)
	if !ok {
		return nil
	}
	u := ur.Usage(id)
	u.Machines += pending
	u.MemoryMiB += pendingMiB
	if u.Machines+1 > maxBoxes {
		return &CapacityError{Cap: "AIRLOCK_MAX_BOXES", Limit: maxBoxes, InUse: u.Machines, Wanted: 1}
	}
	if use := usageMiB(u); use+want > maxMem {
		return &CapacityError{Cap: "AIRLOCK_MAX_MEMORY", Limit: maxMem, InUse: use, Wanted: want}
	}
	return nil
}

// checkMemoryCap refuses, at creation, a box whose memory alone (with
// boxOverheadMiB) passes the host memory cap.
func (r *Runtime) checkMemoryCap(memMiB int) error {
	if _, maxMem := r.capacityLimits(); hostMiB(memMiB) > maxMem {
		return &CapacityError{Cap: "AIRLOCK_MAX_MEMORY", Limit: maxMem, Wanted: hostMiB(memMiB)}
	}
	return nil
}
