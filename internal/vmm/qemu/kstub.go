package qemu

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// A restore loads all of guest RAM, the kernel's image included, from the
// snapshot. QEMU's -kernel loader would still read the whole ELF kernel
// and keep a copy of its segments on its heap (which it does not write
// into guest RAM while it waits for an incoming migration): time on every
// restore's path and memory in every restored QEMU (docs/snapshots.md has
// the numbers). A restore hands QEMU a stub instead,
// made from the box's kernel: an ELF with the same entry point and only
// the kernel's notes, one segment holding them (QEMU needs a loadable
// segment, and the PVH entry note to take the file as an ELF kernel).

// xenElfnotePhys32Entry is the type of the Xen ELF note that gives a
// kernel's 32-bit PVH entry point (XEN_ELFNOTE_PHYS32_ENTRY,
// xen/include/public/elfnote.h), which QEMU's x86 loader requires of an ELF
// kernel.
const xenElfnotePhys32Entry = 18

// kernelStubs caches stubs by kernel file (a restore makes one per box).
var kernelStubs sync.Map // stubKey -> []byte (nil: the kernel has no stub)

// stubKey identifies a version of a kernel file.
type stubKey struct {
	path       string
	size       int64
	ino        uint64
	mtimeNanos int64
}

// writeKernelStub writes the stub of the ELF kernel at kernel (see above)
// to path and reports whether it did: a kernel that is not an ELF file
// with a PVH entry note (a bzImage) has no stub, and the restore loads the
// kernel itself.
func writeKernelStub(kernel, path string) (bool, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(kernel, &st); err != nil {
		return false, &os.PathError{Op: "stat", Path: kernel, Err: err}
	}
	key := stubKey{kernel, st.Size, st.Ino, st.Mtim.Nano()}
	v, ok := kernelStubs.Load(key)
	if !ok {
		stub, err := kernelStub(kernel)
		if err != nil {
			return false, err
		}
		v, _ = kernelStubs.LoadOrStore(key, stub)
	}
	stub := v.([]byte)
	if stub == nil {
		return false, nil
	}
	os.Remove(path)
	// World-readable: a confined QEMU reads it as the box's uid.
	if err := os.WriteFile(path, stub, 0o644); err != nil {
		return false, fmt.Errorf("kernel stub: %w", err)
	}
	return true, nil
}

// kernelStub returns the stub ELF of the kernel at path, nil when the
// kernel is not a 64-bit x86 ELF file with a PVH entry note.
func kernelStub(path string) ([]byte, error) {
	f, err := elf.Open(path)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) {
			return nil, nil // not ELF: a bzImage
		}
		return nil, err
	}
	defer f.Close()
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Machine != elf.EM_X86_64 {
		return nil, nil
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE || p.Filesz == 0 || p.Filesz > 1<<16 {
			continue
		}
		notes := make([]byte, p.Filesz)
		if _, err := io.ReadFull(p.Open(), notes); err != nil {
			return nil, fmt.Errorf("kernel %s: notes: %w", path, err)
		}
		if !hasPVHNote(notes, p.Align) {
			continue
		}
		return stubELF(f.Entry, p.Vaddr, p.Paddr, p.Align, notes), nil
	}
	return nil, nil
}

// hasPVHNote reports whether the ELF notes in b (each field aligned to
// align bytes, at least 4) hold Xen's PVH entry note.
func hasPVHNote(b []byte, align uint64) bool {
	if align < 4 {
		align = 4
	}
	up := func(n uint64) uint64 { return (n + align - 1) / align * align }
	for len(b) >= 12 {
		namesz := uint64(binary.LittleEndian.Uint32(b))
		descsz := uint64(binary.LittleEndian.Uint32(b[4:]))
		typ := binary.LittleEndian.Uint32(b[8:])
		end := 12 + up(namesz)
		if end > uint64(len(b)) {
			return false
		}
		if typ == xenElfnotePhys32Entry && bytes.Equal(bytes.TrimRight(b[12:12+namesz], "\x00"), []byte("Xen")) {
			return true
		}
		end += up(descsz)
		if end > uint64(len(b)) {
			return false
		}
		b = b[end:]
	}
	return false
}

// stubELF returns a 64-bit x86 ELF executable with entry point entry whose
// only content is notes, at vaddr/paddr, as one PT_LOAD and one PT_NOTE
// segment.
func stubELF(entry, vaddr, paddr, align uint64, notes []byte) []byte {
	const ehsize, phsize = 64, 56
	off := uint64(ehsize + 2*phsize)
	var b bytes.Buffer
	le := binary.LittleEndian
	w := func(v any) { binary.Write(&b, le, v) }
	b.Write([]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT), byte(elf.ELFOSABI_NONE)})
	b.Write(make([]byte, 8))
	w(uint16(elf.ET_EXEC))
	w(uint16(elf.EM_X86_64))
	w(uint32(elf.EV_CURRENT))
	w(entry)
	w(uint64(ehsize)) // e_phoff
	w(uint64(0))      // e_shoff
	w(uint32(0))      // e_flags
	w(uint16(ehsize))
	w(uint16(phsize))
	w(uint16(2)) // e_phnum
	w(uint16(0)) // e_shentsize
	w(uint16(0)) // e_shnum
	w(uint16(0)) // e_shstrndx
	for _, t := range []elf.ProgType{elf.PT_LOAD, elf.PT_NOTE} {
		w(uint32(t))
		w(uint32(elf.PF_R))
		w(off)
		w(vaddr)
		w(paddr)
		w(uint64(len(notes))) // p_filesz
		w(uint64(len(notes))) // p_memsz
		w(align)
	}
	b.Write(notes)
	return b.Bytes()
}
