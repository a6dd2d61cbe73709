package qemu

import "fmt"

// ramPart is a piece of guest RAM, in MiB, in guest RAM order: a RAM
// block of its own (a memory backend), which a snapshot's RAM image holds
// at its offset (ramimage.go).
type ramPart struct {
	sizeMiB int
}

// ramLayout returns the parts of memMiB of guest RAM for THPCode and
// THPNone: one memfd (the RAM block "airlock-ram") on 4 KiB pages. A
// memfd (not anonymous memory) so that a snapshot takes the guest's RAM
// from it while the machine is stopped instead of through the migration
// stream, and a restore maps a copy of it; 4 KiB pages so that a box
// costs the host what its guest touches.
//
// Guest RAM used to be split into memfd parts and huge-page anonymous
// parts for the kernel image and the top of RAM, which a Linux guest fills
// whole anyway: ~7k fewer page faults per boot. On a host that is itself
// a VM, a huge page can cost far more than the 512 faults it saves: the
// host's free memory goes back to its hypervisor (free page reporting,
// ballooning) and the first touch of each 2 MiB page faults it in there
// (docs/performance.md has the numbers).
func ramLayout(memMiB int) []ramPart {
	return []ramPart{{memMiB}}
}

// ramPartID is the memory backend id, and so the RAM block name, of guest
// RAM in ramLayout's memfd (the name migration matches).
const ramPartID = "airlock-ram"

// ramArgs returns the QEMU arguments that make the memMiB of guest RAM
// ramLayout's one part: a memfd of QEMU's.
//
// For a restore, anon makes it anonymous memory (memory-backend-ram)
// instead, for a snapshot whose stream holds all of RAM: the stream has a
// marker for each zero page, which QEMU tests by reading the page, and a
// read of a memfd's hole allocates a page, while one of anonymous memory
// maps the zero page. image, when set, maps the part from that file
// instead: privately (memory-backend-file share=off: copy-on-write,
// untouched pages stay the file's and are shared by every QEMU mapping
// it; see ramimage.go), or with shared (the box's own copy) as a booted
// box's memfd is mapped.
func ramArgs(memMiB int, anon bool, image string, shared bool) []string {
	backend := "memory-backend-memfd,"
	switch {
	case image != "" && shared:
		backend = "memory-backend-file,mem-path=" + escapeComma(image) + ",share=on,"
	case image != "":
		backend = "memory-backend-file,mem-path=" + escapeComma(image) + ",share=off,"
	case anon:
		backend = "memory-backend-ram,"
	}
	return []string{"-object", fmt.Sprintf("%sid=%s,size=%dM", backend, ramPartID, memMiB),
		"-machine", "memory-backend=" + ramPartID}
}
