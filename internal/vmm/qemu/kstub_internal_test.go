package qemu

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-run/airlock/internal/assets"
)

// note returns one ELF note (4-byte aligned fields).
func note(name string, typ uint32, desc []byte) []byte {
	pad := func(b []byte) []byte { return append(b, make([]byte, (4-len(b)%4)%4)...) }
	var b bytes.Buffer
	n := append([]byte(name), 0)
	binary.Write(&b, binary.LittleEndian, [3]uint32{uint32(len(n)), uint32(len(desc)), typ})
	b.Write(pad(n))
	b.Write(pad(desc))
	return b.Bytes()
}

// fakeKernel writes an ELF "kernel": a 1 MiB segment at 16 MiB and a
// PT_NOTE of notes, as stubELF lays out a file but with a large segment.
func fakeKernel(t *testing.T, notes []byte) string {
	t.Helper()
	const ehsize, phsize = 64, 56
	img := stubELF(0x1000000, 0xffffffff81000000, 0x1000000, 4, notes)
	// Turn the stub's PT_LOAD into a 1 MiB one of its own data.
	seg := bytes.Repeat([]byte{0xcc}, 1<<20)
	dataOff := uint64(len(img))
	img = append(img, seg...)
	le := binary.LittleEndian
	ph := img[ehsize:]
	le.PutUint64(ph[8:], dataOff)
	le.PutUint64(ph[32:], uint64(len(seg)))
	le.PutUint64(ph[40:], uint64(len(seg)))
	p := filepath.Join(t.TempDir(), "vmlinux")
	if err := os.WriteFile(p, img, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestKernelStubKeepsEntryAndPVHNoteOnly(t *testing.T) {
	pvh := note("Xen", xenElfnotePhys32Entry, []byte{0x00, 0x10, 0x00, 0x01})
	notes := append(note("GNU", 3, bytes.Repeat([]byte{7}, 20)), pvh...)
	k := fakeKernel(t, notes)
	stub := filepath.Join(t.TempDir(), "stub")
	ok, err := writeKernelStub(k, stub)
	if err != nil || !ok {
		t.Fatalf("writeKernelStub = %v, %v; want a stub", ok, err)
	}
	fi, err := os.Stat(stub)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o004 == 0 {
		t.Errorf("stub mode %v: a confined QEMU (another uid) must read it", fi.Mode())
	}
	if fi.Size() > 4096 {
		t.Errorf("stub is %d bytes: it should hold the notes only", fi.Size())
	}
	f, err := elf.Open(stub)
	if err != nil {
		t.Fatalf("the stub is no ELF file QEMU can load: %v", err)
	}
	defer f.Close()
	if f.Entry != 0x1000000 || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		t.Errorf("stub entry %#x machine %v type %v, want the kernel's (0x1000000, x86-64, EXEC)", f.Entry, f.Machine, f.Type)
	}
	var load, pnote int
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_LOAD:
			load++
			if p.Memsz != uint64(len(notes)) {
				t.Errorf("stub loads %d bytes, want only the %d of the notes", p.Memsz, len(notes))
			}
		case elf.PT_NOTE:
			pnote++
			b, _ := io.ReadAll(p.Open())
			if !bytes.Equal(b, notes) || p.Paddr != 0x1000000 {
				t.Errorf("stub notes at %#x = %x, want the kernel's %x at 0x1000000", p.Paddr, b, notes)
			}
			if !hasPVHNote(b, p.Align) {
				t.Error("the stub's notes lost the PVH entry note")
			}
		}
	}
	if load != 1 || pnote != 1 {
		t.Errorf("stub has %d PT_LOAD and %d PT_NOTE segments, want 1 and 1", load, pnote)
	}
}

func TestKernelStubNoneWithoutPVHNote(t *testing.T) {
	dir := t.TempDir()
	for name, k := range map[string]string{
		"ELF without a PVH note": fakeKernel(t, note("GNU", 3, bytes.Repeat([]byte{7}, 20))),
		"not ELF (a bzImage)":    filepath.Join(dir, "bzImage"),
	} {
		if name == "not ELF (a bzImage)" {
			os.WriteFile(k, append([]byte("MZ"), make([]byte, 4096)...), 0o600)
		}
		stub := filepath.Join(dir, "stub")
		ok, err := writeKernelStub(k, stub)
		if err != nil || ok {
			t.Errorf("%s: writeKernelStub = %v, %v; want no stub and no error (the restore loads the kernel itself)", name, ok, err)
		}
		if _, err := os.Stat(stub); err == nil {
			t.Errorf("%s: a stub file was written", name)
		}
	}
	if _, err := writeKernelStub(filepath.Join(dir, "missing"), filepath.Join(dir, "stub")); err == nil {
		t.Error("a missing kernel gave no error")
	}
}

// The airlock kernel, where one is built: its stub keeps its entry and
// its PVH note, and is a few hundred bytes instead of ~20 MB.
func TestKernelStubOfTheGuestKernel(t *testing.T) {
	k, _, err := assets.FindKernel("")
	if err != nil {
		t.Skip(err)
	}
	want, err := elf.Open(k.Path)
	if err != nil {
		t.Skipf("%s is not ELF: %v", k.Path, err)
	}
	defer want.Close()
	stub := filepath.Join(t.TempDir(), "stub")
	ok, err := writeKernelStub(k.Path, stub)
	if err != nil || !ok {
		t.Fatalf("writeKernelStub(%s) = %v, %v", k.Path, ok, err)
	}
	f, err := elf.Open(stub)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := os.Stat(stub)
	if f.Entry != want.Entry || fi.Size() > 4096 {
		t.Errorf("stub entry %#x (kernel's %#x), %d bytes", f.Entry, want.Entry, fi.Size())
	}
}
