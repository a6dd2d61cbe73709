// Package capacity is the arithmetic of the host-wide caps on running boxes:
// how many run (Limits.Boxes) and how much host memory they take
// (Limits.MemoryMiB: guest memory plus OverheadMiB a box for QEMU and its
// helpers). It works on counts and limits only; the caller counts the
// machines (the VM driver) and the boxes of its home (the box store).
package capacity

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

const (
	// DefaultMaxBoxes is the default cap on running boxes.
	DefaultMaxBoxes = 128
	// ReserveMiB is host RAM kept out of the default memory cap: the
	// larger of this and a tenth of RAM.
	ReserveMiB = 2048
	// OverheadMiB is the host memory a running box takes besides its
	// guest RAM, counted against the memory cap with each box's memory:
	// QEMU's own (heap, device state, I/O buffers, and under TCG the
	// translated-code buffer), the box's network helper, its console
	// drain and the virtiofsd processes of its shared directories.
	// Measured from /proc/PID/smaps of an idle 512 MiB box under TCG
	// after one exec (airlock kernel; Debian's in brackets): QEMU 118
	// [268] MiB RSS, of which 31 [114] MiB guest RAM, 33 [56] MiB
	// translated code, 20 [25] MiB other anonymous memory and 35 [73] MiB
	// file pages (binary and libraries, shared between boxes); network
	// helper 9.3 MiB; console drain 1.5 MiB of its own (10.5 MiB PSS);
	// virtiofsd 3-3.6 MiB RSS, ~1 MiB PSS, for each of its two processes.
	// That is 65-100 MiB a box beyond guest RAM. The translated code
	// grows with the code the guest runs (QEMU reserves 1 GiB for it):
	// after python3 imported ten modules and ran a loop, 64 MiB, with 25
	// MiB other anonymous memory (~100 MiB a box, 135 with the file pages
	// of a lone QEMU). Under KVM there is none. 128 MiB covers TCG with
	// some room.
	OverheadMiB = 128

	// CapBoxes and CapMemory name the caps in an Exceeded (and in the
	// public airlock.CapacityError): the environment variables that set
	// them.
	CapBoxes  = "AIRLOCK_MAX_BOXES"
	CapMemory = "AIRLOCK_MAX_MEMORY"
)

// HostMiB is the host memory a box of guestMiB takes for the caps.
func HostMiB(guestMiB int) int { return guestMiB + OverheadMiB }

// Usage is what running machines take: how many, and their guest memory
// in MiB.
type Usage struct {
	Machines  int
	MemoryMiB int
}

// HostMiB is the host memory the machines u counts take for the caps.
func (u Usage) HostMiB() int { return u.MemoryMiB + u.Machines*OverheadMiB }

// Limits are the caps: running boxes, and MiB of host memory.
type Limits struct {
	Boxes     int
	MemoryMiB int
}

// Resolve fills in the defaults of caps not set (<= 0): DefaultMaxBoxes,
// and host RAM (hostMiB, 0 if unknown: no memory cap to speak of) minus
// the larger of ReserveMiB and a tenth of it.
func Resolve(boxes, memMiB, hostMiB int) Limits {
	if boxes <= 0 {
		boxes = DefaultMaxBoxes
	}
	if memMiB <= 0 {
		if hostMiB == 0 {
			memMiB = 1 << 30
		} else {
			memMiB = hostMiB - max(ReserveMiB, hostMiB/10)
		}
	}
	return Limits{Boxes: boxes, MemoryMiB: memMiB}
}

// HostMemMiB returns MemTotal from /proc/meminfo in MiB (0 if unknown).
func HostMemMiB() int {
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

// Exceeded says which cap a start would pass.
type Exceeded struct {
	Cap    string // CapBoxes or CapMemory
	Limit  int    // boxes, or MiB
	InUse  int    // boxes, or MiB of host memory of running boxes (Usage.HostMiB)
	Wanted int    // MiB of host memory the box takes (HostMiB; memory cap), 1 for boxes
}

// Error is the text of airlock.CapacityError.
func (e *Exceeded) Error() string {
	if e.Cap == CapBoxes {
		return fmt.Sprintf("host capacity: %d boxes already run on this host, the cap is %d (Options.MaxBoxes, or AIRLOCK_MAX_BOXES=N)", e.InUse, e.Limit)
	}
	if e.InUse == 0 {
		return fmt.Sprintf("host capacity: the box takes %d MiB of host memory (its memory and %d MiB for QEMU, its network helper and virtiofsd), more than the host cap of %d MiB (Options.MaxMemoryMiB, or AIRLOCK_MAX_MEMORY=MiB; default host RAM minus a reserve)", e.Wanted, OverheadMiB, e.Limit)
	}
	return fmt.Sprintf("host capacity: running boxes take %d MiB of host memory, %d MiB more (the box's memory and %d MiB for QEMU, its network helper and virtiofsd) would pass the cap of %d MiB (Options.MaxMemoryMiB, or AIRLOCK_MAX_MEMORY=MiB)", e.InUse, e.Wanted, OverheadMiB, e.Limit)
}

// Alone returns the cap a box of memMiB guest memory passes on its own
// (its host memory over the memory cap), or nil.
func (l Limits) Alone(memMiB int) *Exceeded {
	if want := HostMiB(memMiB); want > l.MemoryMiB {
		return &Exceeded{Cap: CapMemory, Limit: l.MemoryMiB, Wanted: want}
	}
	return nil
}

// Start returns the cap that starting one more box of memMiB guest memory
// passes, with the machines u running (nil: not counted, only the box
// alone is checked), or nil when it fits.
func (l Limits) Start(u *Usage, memMiB int) *Exceeded {
	if e := l.Alone(memMiB); e != nil || u == nil {
		return e
	}
	if u.Machines+1 > l.Boxes {
		return &Exceeded{Cap: CapBoxes, Limit: l.Boxes, InUse: u.Machines, Wanted: 1}
	}
	want := HostMiB(memMiB)
	if use := u.HostMiB(); use+want > l.MemoryMiB {
		return &Exceeded{Cap: CapMemory, Limit: l.MemoryMiB, InUse: use, Wanted: want}
	}
	return nil
}

// Pending is what this process is making or starting that the machines
// counted may not show yet: pool fills and launches.
type Pending struct {
	Filling, FillingMiB   int // pool boxes being made, and their guest MiB
	Starting, StartingMiB int // launches in progress, and their guest MiB
}

// Fill says why one more pool box of memMiB does not fit the host caps
// with the machines u running (nil: not counted) and p in progress, ""
// when it does. Fills and starts whose machine runs already are counted
// twice (in u, and in p): the fills leave room rather than take it.
func (l Limits) Fill(u *Usage, p Pending, memMiB int) string {
	if u == nil {
		if HostMiB(memMiB) > l.MemoryMiB {
			return fmt.Sprintf("a pool box's %d MiB of memory (and %d MiB for QEMU and its helpers) is more than the host memory cap of %d MiB (Options.MaxMemoryMiB)", memMiB, OverheadMiB, l.MemoryMiB)
		}
		return ""
	}
	inflight := p.Filling + p.Starting
	if n := u.Machines + inflight; n+1 > l.Boxes {
		return fmt.Sprintf("at the host cap of %d running boxes (Options.MaxBoxes, or AIRLOCK_MAX_BOXES=N): %d run, %d more are being made or started",
			l.Boxes, u.Machines, inflight)
	}
	pending := p.FillingMiB + p.StartingMiB + inflight*OverheadMiB
	if mem := u.HostMiB() + pending; mem+HostMiB(memMiB) > l.MemoryMiB {
		return fmt.Sprintf("at the host memory cap of %d MiB (Options.MaxMemoryMiB, or AIRLOCK_MAX_MEMORY=MiB): running boxes take %d MiB, %d MiB are being made or started, a pool box takes %d MiB (its memory and %d MiB for QEMU and its helpers)",
			l.MemoryMiB, u.HostMiB(), pending, HostMiB(memMiB), OverheadMiB)
	}
	return ""
}

// Evict reports whether starting a box of memMiB passes a host cap, with
// the machines u running and starting more launches of startingMiB in
// progress, that removing running boxes could help with: false when u is
// nil (not counted) or the box alone passes the memory cap.
func (l Limits) Evict(u *Usage, starting, startingMiB, memMiB int) bool {
	if u == nil || HostMiB(memMiB) > l.MemoryMiB {
		return false
	}
	return u.Machines+starting+1 > l.Boxes ||
		u.HostMiB()+startingMiB+starting*OverheadMiB+HostMiB(memMiB) > l.MemoryMiB
}

// HomeFill says why one more pool box does not fit a home's budget of
// limit boxes not stopped (0: none), with users boxes and held pool boxes
// in it, "" when it does.
func HomeFill(limit, users, held int) string {
	if limit > 0 && users+held+1 > limit {
		return fmt.Sprintf("at the home's limit of %d boxes not stopped (airlock serve --max-boxes, or Options.PoolMaxHomeBoxes): %d boxes and %d pool boxes",
			limit, users, held)
	}
	return ""
}

// HomeFull reports whether one more box passes a home's budget of limit
// boxes not stopped (0: none), with users boxes and held pool boxes in it.
func HomeFull(limit, users, held int) bool {
	return limit > 0 && users+1+held > limit
}
