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
//
// images, when images[i] != "", maps part i from that file: privately
// (memory-backend-file share=off: copy-on-write, untouched pages stay the
// file's and are shared by every QEMU mapping it; see ramimage.go), or
// with shared (the box's own copy) as a booted box's memfd is mapped.
func ramArgs(parts []ramPart, anon bool, images []string, shared bool) []string {
	image := func(i int) string {
		if i < len(images) {
			return images[i]
		}
		return ""
	}
	backend := func(i int, p ramPart) string {
		switch {
		case image(i) != "" && shared:
			return "memory-backend-file,mem-path=" + escapeComma(image(i)) + ",share=on,"
		case image(i) != "":
			return "memory-backend-file,mem-path=" + escapeComma(image(i)) + ",share=off,"
		case p.huge || anon:
			return "memory-backend-ram,"
		}
		return "memory-backend-memfd,"
	}
	if len(parts) == 1 && !parts[0].huge {
		return []string{"-object", fmt.Sprintf("%sid=%s,size=%dM", backend(0, parts[0]), ramPartID(parts, 0), parts[0].sizeMiB),
			"-machine", "memory-backend=" + ramPartID(parts, 0)}
	}
	var a []string
	for i, p := range parts {
		a = append(a, "-object", fmt.Sprintf("%sid=%s,size=%dM", backend(i, p), ramPartID(parts, i), p.sizeMiB),
			"-numa", "node,memdev="+ramPartID(parts, i))
	}
	return a
}

// ramPartID is the memory backend id (and so the RAM block name) of part
// i of parts.
func ramPartID(parts []ramPart, i int) string {
	if len(parts) == 1 && !parts[0].huge {
		return "airlock-ram"
	}
	return fmt.Sprintf("airlock-ram%d", i)
}
