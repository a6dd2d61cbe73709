package qemu

import (
	"debug/elf"
	"fmt"
)

// PhysRange is a guest-physical address range [Start, End), in bytes.
type PhysRange struct{ Start, End uint64 }

// KernelSpan returns the guest-physical range the loadable segments
// (PT_LOAD, by physical address) of the ELF kernel at path occupy, or the
// zero range when path is not an ELF file.
func KernelSpan(path string) PhysRange {
	f, err := elf.Open(path)
	if err != nil {
		return PhysRange{}
	}
	defer f.Close()
	var r PhysRange
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Memsz == 0 {
			continue
		}
		if r.End == 0 || p.Paddr < r.Start {
			r.Start = p.Paddr
		}
		if end := p.Paddr + p.Memsz; end > r.End {
			r.End = end
		}
	}
	return r
}

// ramPart is a piece of guest RAM, in MiB, in guest RAM order.
type ramPart struct {
	sizeMiB int
	huge    bool
}

// hugeAlignMiB is the size of an x86-64 transparent huge page, in MiB.
const hugeAlignMiB = 2

// ramLayout splits memMiB of guest RAM for THPCode: 4 KiB pages (a memfd)
// where the guest touches memory sparsely, huge pages (anonymous memory,
// which QEMU asks huge pages for) where a Linux guest fills whole 2 MiB
// regions anyway, so that they cost no extra host memory there but save
// 512 page faults each:
//   - the kernel image (kernel, 2 MiB-aligned), which QEMU's loader writes
//     in full before the guest starts;
//   - the top of RAM, where Linux puts its memory map (64 bytes of struct
//     page per 4 KiB: memMiB/64) and, top down, its first allocations
//     (8 MiB more; measured: the top 11 MiB of a 512 MiB box were resident
//     after a boot, 8 of them the memory map).
//
// Under TCG with the airlock kernel this took a boot from ~12.5k to ~5.6k
// page faults at the same peak RSS.
func ramLayout(memMiB int, kernel PhysRange) []ramPart {
	type span struct{ lo, hi int } // MiB
	var huge []span
	if kernel.End > kernel.Start {
		lo := int(kernel.Start>>20) / hugeAlignMiB * hugeAlignMiB
		hi := (int((kernel.End+(1<<20)-1)>>20) + hugeAlignMiB - 1) / hugeAlignMiB * hugeAlignMiB
		if hi > memMiB {
			hi = memMiB
		}
		if lo < hi {
			huge = append(huge, span{lo, hi})
		}
	}
	top := (memMiB/64+hugeAlignMiB-1)/hugeAlignMiB*hugeAlignMiB + 8
	lo := (memMiB - top) / hugeAlignMiB * hugeAlignMiB
	if lo < 0 {
		lo = 0
	}
	if len(huge) > 0 && lo <= huge[0].hi {
		// The two meet: one huge span from the kernel image up.
		huge[0].hi = memMiB
		if lo < huge[0].lo {
			huge[0].lo = lo
		}
	} else if lo < memMiB {
		huge = append(huge, span{lo, memMiB})
	}
	var parts []ramPart
	at := 0
	for _, h := range huge {
		if h.lo > at {
			parts = append(parts, ramPart{h.lo - at, false})
		}
		parts = append(parts, ramPart{h.hi - h.lo, true})
		at = h.hi
	}
	if at < memMiB {
		parts = append(parts, ramPart{memMiB - at, false})
	}
	return parts
}

// ramArgs returns the QEMU arguments that build guest RAM from parts: one
// memory backend per part, joined in order as NUMA nodes' memory (QEMU
// lays the nodes' memory out one after the other; microvm describes no
// NUMA topology to the guest, which sees one range of RAM as before).
//
// anon makes every part anonymous memory (memory-backend-ram), as a
// restore wants: the migration stream has a marker for each zero page,
// which QEMU tests by reading the page, and a read of a memfd's hole
// allocates a page, while one of anonymous memory maps the zero page. The
// parts keep their ids and sizes, which is what migration matches.
func ramArgs(parts []ramPart, anon bool) []string {
	if len(parts) == 1 && !parts[0].huge {
		backend := "memory-backend-memfd"
		if anon {
			backend = "memory-backend-ram"
		}
		return []string{"-object", fmt.Sprintf("%s,id=airlock-ram,size=%dM", backend, parts[0].sizeMiB),
			"-machine", "memory-backend=airlock-ram"}
	}
	var a []string
	for i, p := range parts {
		backend := "memory-backend-memfd"
		if p.huge || anon {
			backend = "memory-backend-ram"
		}
		a = append(a, "-object", fmt.Sprintf("%s,id=airlock-ram%d,size=%dM", backend, i, p.sizeMiB),
			"-numa", fmt.Sprintf("node,memdev=airlock-ram%d", i))
	}
	return a
}
