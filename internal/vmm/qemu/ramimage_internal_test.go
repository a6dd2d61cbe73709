package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRAMImageRoundTrip: the pages written into memfds (as QEMU's RAM
// parts) come back, at their offsets, from the image file (as a restore's
// own copy) and from the sealed copies Fork's children map, which refuse
// writes; zero pages and holes take no space in the image.
func TestRAMImageRoundTrip(t *testing.T) {
	parts := []ramPart{{sizeMiB: 2}, {sizeMiB: 1}, {sizeMiB: 4}} // part 1 not in the image
	page := func(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }
	want := map[int]map[int64][]byte{ // part -> offset -> content
		0: {0: page(1), 8192: page(2)},
		2: {1 << 20: page(3), 3<<20 + 4096: page(4)},
	}
	memfds := map[int]*os.File{}
	for i, pages := range want {
		fd, err := unix.MemfdCreate("memory-backend-memfd", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "memfd")
		defer f.Close()
		f.Truncate(int64(parts[i].sizeMiB) << 20)
		for off, b := range pages {
			f.WriteAt(b, off)
		}
		f.WriteAt(make([]byte, 4096), 4096) // an allocated page of zeros
		memfds[i] = f
	}
	path := filepath.Join(t.TempDir(), snapRAM)
	n, err := writeRAMImage(path, parts, memfds)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4*4096 {
		t.Errorf("image data %d bytes, want the 4 non-zero pages", n)
	}
	var st syscall.Stat_t
	syscall.Stat(path, &st)
	if st.Size != 7<<20 || st.Blocks*512 > 64<<10 {
		t.Errorf("image: size %d, allocated %d bytes: want the RAM size, sparse", st.Size, st.Blocks*512)
	}
	// The file comes back as a restore's own copy (ramCopy).
	copies, filled, err := ramCopy(path, parts, []int{0, 2})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(copies)
	if err := filled(); err != nil {
		t.Fatal(err)
	}
	// A transient snapshot's sealed copies, taken from the memfds.
	sealed, n, err := sealedCopies(parts, memfds)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4*4096 {
		t.Errorf("sealed copies hold %d bytes of data, want the 4 non-zero pages", n)
	}
	var c ramImageCache
	key := ramImageKey{dev: 1, ino: 2}
	c.hold(key, sealed)
	files, done, ok := c.lookup(key)
	if !ok {
		t.Fatal("the held image is not found")
	}
	defer done()
	if files[1] != nil || len(files) != 3 {
		t.Fatalf("images %v: want parts 0 and 2", files)
	}
	for i, pages := range want {
		got := make([]byte, 4096)
		for off, b := range pages {
			for what, f := range map[string]*os.File{"copy": copies[i], "sealed": files[i]} {
				f.ReadAt(got, off)
				if !bytes.Equal(got, b) {
					t.Errorf("%s part %d offset %d: got %x..., want %x...", what, i, off, got[:4], b[:4])
				}
			}
		}
		if _, err := files[i].WriteAt([]byte{9}, 0); err == nil {
			t.Errorf("part %d: a write to the sealed image worked", i)
		}
		if _, err := unix.Mmap(int(files[i].Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
			t.Errorf("part %d: a shared writable mapping of the sealed image worked", i)
		}
		m, err := unix.Mmap(int(files[i].Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		if err != nil {
			t.Fatalf("part %d: private mapping (what QEMU makes): %v", i, err)
		}
		m[0] = 7 // copy-on-write: the image keeps its page
		unix.Munmap(m)
		files[i].ReadAt(got, 0)
		var first byte
		if p, ok := pages[0]; ok {
			first = p[0]
		}
		if got[0] != first {
			t.Errorf("part %d: a private write reached the image (%d, want %d)", i, got[0], first)
		}
	}
	// Every restore from the snapshot shares the memfds; another
	// snapshot's key finds none.
	again, done2, ok := c.lookup(key)
	if !ok {
		t.Fatal("second lookup found nothing")
	}
	defer done2()
	if again[0] != files[0] || again[2] != files[2] {
		t.Errorf("second restore got other memfds")
	}
	if _, _, ok := c.lookup(ramImageKey{dev: 1, ino: 3}); ok {
		t.Errorf("an image was found for a snapshot that holds none")
	}
	// A damaged image (another size) is refused.
	os.Truncate(path, 4<<20)
	if f, _, err := openImage(path, parts); err == nil {
		f.Close()
		t.Errorf("an image of the wrong size was accepted")
	}
}
