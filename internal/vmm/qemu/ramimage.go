package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A snapshot's RAM image (snapRAM) holds the guest RAM of the parts of
// THPCode's layout that a box keeps in memfds (ramLayout: all but the
// kernel image and the top of RAM), as one sparse file of the guest's RAM
// size with each part at its offset in RAM order. The save takes it
// straight from QEMU's memfds (only their allocated pages, never reading a
// hole) while the machine is stopped, and migrates with the capability
// x-ignore-shared, which leaves those (shared) RAM blocks out of the
// stream: QEMU no longer reads every page of the box.
//
// A restore maps each part privately (memory-backend-file share=off):
// guest pages stay the image's until the guest writes them, so boxes
// restored from one image share its untouched pages. QEMU 7.2 opens a
// memory-backend-file read-write unless readonly=on, which also maps the
// guest RAM read-only (guest writes are lost), so QEMU cannot map the
// snapshot's file itself without being able to change it for every other
// restore; it maps a sealed memfd (F_SEAL_WRITE: no write(2), no shared
// writable mapping; private mappings work) that this process fills from
// the file once and shares between the restores it starts (Fork's
// children, a pool's refills) for ramImageTTL after the last one.

// snapRAM is the RAM image file of a snapshot directory.
const snapRAM = "ram"

// memfdName is how QEMU 7.2 names the memfds of its memory-backend-memfd
// objects (/proc/PID/fd links read "/memfd:memory-backend-memfd (deleted)");
// copyName is the name of a restored box's own copy of a RAM image
// (ramCopy), sealedName that of a sealed image restores share.
const (
	memfdName  = "/memfd:memory-backend-memfd"
	copyName   = "airlock-ram-copy"
	sealedName = "airlock-ram-image"
)

// ramImageTTL is how long a RAM image memfd is kept after the last
// restore that used it.
const ramImageTTL = 30 * time.Second

// imageParts returns the indices of c's RAM parts (ramLayout) that a RAM
// image can hold: the memfd ones, when guest RAM has THPCode's layout and
// no virtio-fs share (which needs all of RAM in one shared memfd).
func imageParts(c Config) ([]ramPart, []int) {
	if c.THP != THPCode || len(c.FSShares) > 0 {
		return nil, nil
	}
	mem := c.MemoryMiB
	if mem <= 0 {
		mem = 512
	}
	span := c.KernelSpan
	if span == (PhysRange{}) {
		span = KernelSpan(c.Kernel)
	}
	parts := ramLayout(mem, span)
	var idx []int
	for i, p := range parts {
		if !p.huge {
			idx = append(idx, i)
		}
	}
	return parts, idx
}

// partOffset returns the byte offset of part i in guest RAM order.
func partOffset(parts []ramPart, i int) int64 {
	var off int64
	for _, p := range parts[:i] {
		off += int64(p.sizeMiB) << 20
	}
	return off
}

// qemuMemfds opens the memfds of QEMU process pid that hold parts idx of
// parts (matched by size, which ramLayout makes differ between them). It
// fails when they cannot be told apart or opened (another uid's QEMU
// without the privilege to read its descriptors): the caller then saves
// RAM in the migration stream.
func qemuMemfds(pid int, parts []ramPart, idx []int) (map[int]*os.File, error) {
	bySize := map[int64]int{}
	for _, i := range idx {
		sz := int64(parts[i].sizeMiB) << 20
		if _, dup := bySize[sz]; dup {
			return nil, fmt.Errorf("two RAM parts of %d bytes", sz)
		}
		bySize[sz] = i
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]*os.File{}
	inodes := map[uint64]bool{}
	fail := func(err error) (map[int]*os.File, error) {
		for _, f := range out {
			f.Close()
		}
		return nil, err
	}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.HasPrefix(link, memfdName) && !strings.HasPrefix(link, "/memfd:"+copyName+" ") {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return fail(err)
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			f.Close()
			return fail(err)
		}
		if inodes[st.Ino] {
			f.Close() // another descriptor of one already found
			continue
		}
		inodes[st.Ino] = true
		i, ok := bySize[st.Size]
		if _, seen := out[i]; !ok || seen {
			f.Close()
			return fail(fmt.Errorf("QEMU has a memfd of %d bytes that is no RAM part of its box", st.Size))
		}
		out[i] = f
	}
	if len(out) != len(idx) {
		return fail(fmt.Errorf("QEMU has %d RAM memfds, want %d", len(out), len(idx)))
	}
	return out, nil
}

// writeRAMImage writes the allocated, non-zero pages of each part's memfd
// into a new sparse file at path, of the size of all parts, at the part's
// offset. It returns the bytes of data written.
func writeRAMImage(path string, parts []ramPart, memfds map[int]*os.File) (n int64, err error) {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if err := out.Truncate(partOffset(parts, len(parts))); err != nil {
		return 0, err
	}
	for i, f := range memfds {
		m, err := copyData(out, f, partOffset(parts, i), 0, int64(parts[i].sizeMiB)<<20, true)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// copyData copies the allocated pages of src's range [from, from+size)
// to dst at dstOff+(offset-from): holes are never read (a read of a
// memfd's hole would allocate a page). With skipZero, pages of zeros are
// left out too (through this process); without, the kernel copies
// (sendfile: twice as fast here). It returns the bytes written.
func copyData(dst, src *os.File, dstOff, from, size int64, skipZero bool) (int64, error) {
	const page = 4096
	buf := make([]byte, 1<<20)
	zero := make([]byte, page)
	var n int64
	fd := int(src.Fd())
	end := from + size
	for off := from; off < end; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && data >= end) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return n, fmt.Errorf("seek hole: %w", err)
		}
		hole = min(hole, end)
		if !skipZero {
			if _, err := unix.Seek(int(dst.Fd()), dstOff+data-from, io.SeekStart); err != nil {
				return n, err
			}
			for at := data; at < hole; {
				m, err := unix.Sendfile(int(dst.Fd()), fd, &at, int(min(hole-at, 1<<30)))
				if err != nil {
					return n, fmt.Errorf("sendfile: %w", err)
				}
				if m == 0 {
					return n, io.ErrUnexpectedEOF
				}
				n += int64(m)
			}
			off = hole
			continue
		}
		for at := data; at < hole; {
			chunk := buf[:min(int64(len(buf)), hole-at)]
			m, err := src.ReadAt(chunk, at)
			if m < len(chunk) {
				if err == nil || err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return n, err
			}
			// Write runs of non-zero pages.
			for p := 0; p < len(chunk); {
				if q := min(p+page, len(chunk)); bytes.Equal(chunk[p:q], zero[:q-p]) {
					p = q
					continue
				}
				q := p
				for q < len(chunk) && !bytes.Equal(chunk[q:min(q+page, len(chunk))], zero[:min(q+page, len(chunk))-q]) {
					q = min(q+page, len(chunk))
				}
				if _, err := dst.WriteAt(chunk[p:q], dstOff+at-from+int64(p)); err != nil {
					return n, err
				}
				n += int64(q - p)
				p = q
			}
			at += int64(len(chunk))
		}
		off = hole
	}
	return n, nil
}

// ramImageCache keeps the sealed memfds of RAM images recently restored
// from, so that the restores one process starts share them.
type ramImageCache struct {
	mu sync.Mutex
	m  map[ramImageKey]*ramImage
}

// ramImageKey identifies a RAM image file's content: a snapshot's files
// are written once and never changed.
type ramImageKey struct {
	dev, ino   uint64
	size, mtim int64
}

type ramImage struct {
	ready chan struct{} // closed once files and err are set
	files []*os.File    // by part index; nil for parts not in the image
	err   error
	users int
	last  time.Time
}

// get returns the memfds of the RAM image at path for parts idx of parts
// (by part index, len(parts)), filled and sealed once per image, and what
// the caller calls once QEMU holds them.
func (c *ramImageCache) get(path string, parts []ramPart, idx []int) ([]*os.File, func(), error) {
	f, st, err := openImage(path, parts)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	key := ramImageKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtim: st.Mtim.Nano()}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[ramImageKey]*ramImage{}
	}
	im := c.m[key]
	fill := im == nil
	if fill {
		im = &ramImage{ready: make(chan struct{})}
		c.m[key] = im
	}
	im.users++
	c.mu.Unlock()
	done := func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		im.users--
		im.last = time.Now()
		if im.users == 0 {
			time.AfterFunc(ramImageTTL, func() { c.expire(key, im) })
		}
	}
	if fill {
		im.files, im.err = fillRAMImage(f, parts, idx, true)
		close(im.ready)
		if im.err != nil {
			c.mu.Lock()
			delete(c.m, key)
			c.mu.Unlock()
		}
	}
	<-im.ready
	if im.err != nil {
		done()
		return nil, nil, im.err
	}
	return im.files, done, nil
}

// expire closes im's memfds (QEMUs that map them keep them) if no restore
// used it for ramImageTTL.
func (c *ramImageCache) expire(key ramImageKey, im *ramImage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if im.users > 0 || time.Since(im.last) < ramImageTTL || c.m[key] != im {
		return
	}
	delete(c.m, key)
	for _, f := range im.files {
		if f != nil {
			f.Close()
		}
	}
}

// openImage opens the RAM image at path, which must be of the size of
// parts.
func openImage(path string, parts []ramPart) (*os.File, syscall.Stat_t, error) {
	var st syscall.Stat_t
	f, err := os.Open(path)
	if err != nil {
		return nil, st, err
	}
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, st, err
	}
	if want := partOffset(parts, len(parts)); st.Size != want {
		f.Close()
		return nil, st, fmt.Errorf("the snapshot's RAM image is %d bytes, not the %d of its machine's RAM: the snapshot is damaged; take a new one", st.Size, want)
	}
	return f, st, nil
}

// ramCopy returns a restored box's own copy of the RAM image at path:
// one memfd per part in idx (by part index, len(parts)), which its QEMU
// maps shared (Config.RAMCopy) as a booted box's RAM. Writes to pages the
// image does not hold allocate once, as in a booted box (a private
// mapping of a memfd's hole allocates a page of the memfd and another for
// the copy), and a snapshot of the box takes its RAM image from them.
//
// Parts above the first huge part (the kernel image) are filled in the
// background, while QEMU starts: QEMU's loader writes boot data and the
// kernel below and into that part, never above it, so only the parts
// below are filled before QEMU may run. filled waits for the background
// copy and returns its error; the guest must not run before.
func ramCopy(path string, parts []ramPart, idx []int) (files []*os.File, filled func() error, err error) {
	f, _, err := openImage(path, parts)
	if err != nil {
		return nil, nil, err
	}
	var now, later []int
	for _, i := range idx {
		if aboveKernel(parts, i) {
			later = append(later, i)
		} else {
			now = append(now, i)
		}
	}
	files, err = fillRAMImage(f, parts, now, false)
	if err != nil || len(later) == 0 {
		f.Close()
		return files, func() error { return nil }, err
	}
	rest, err := makeRAMCopies(parts, later)
	if err != nil {
		f.Close()
		closeAll(files)
		return nil, nil, err
	}
	for _, i := range later {
		files[i] = rest[i]
	}
	done := make(chan error, 1)
	go func() {
		defer f.Close()
		for _, i := range later {
			if _, err := copyData(rest[i], f, 0, partOffset(parts, i), int64(parts[i].sizeMiB)<<20, false); err != nil {
				done <- fmt.Errorf("load the snapshot's RAM image: %w", err)
				return
			}
		}
		done <- nil
	}()
	var once sync.Once
	var ferr error
	return files, func() error {
		once.Do(func() { ferr = <-done })
		return ferr
	}, nil
}

// aboveKernel reports whether part i lies above the first huge part of
// parts (the kernel image's, see ramLayout).
func aboveKernel(parts []ramPart, i int) bool {
	for j := 0; j < i; j++ {
		if parts[j].huge {
			return true
		}
	}
	return false
}

// makeRAMCopies makes an empty memfd of each part in idx (by part index,
// len(parts)), sized to the part.
func makeRAMCopies(parts []ramPart, idx []int) ([]*os.File, error) {
	files := make([]*os.File, len(parts))
	for _, i := range idx {
		m, err := partMemfd(copyName, unix.MFD_CLOEXEC, int64(parts[i].sizeMiB)<<20)
		if err != nil {
			closeAll(files)
			return nil, fmt.Errorf("load the snapshot's RAM image: %w", err)
		}
		files[i] = m
	}
	return files, nil
}

// partMemfd makes an empty memfd of size bytes.
func partMemfd(name string, flags int, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, flags)
	if err != nil {
		return nil, err
	}
	m := os.NewFile(uintptr(fd), name)
	if err := m.Truncate(size); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// fillRAMImage makes one memfd per part in idx holding that part's range
// of the image f, sealed (no write(2), no shared writable mapping) with
// seal.
func fillRAMImage(f *os.File, parts []ramPart, idx []int, seal bool) ([]*os.File, error) {
	files := make([]*os.File, len(parts))
	fail := func(err error) ([]*os.File, error) {
		for _, m := range files {
			if m != nil {
				m.Close()
			}
		}
		return nil, fmt.Errorf("load the snapshot's RAM image: %w", err)
	}
	for _, i := range idx {
		name, flags := copyName, unix.MFD_CLOEXEC
		if seal {
			name, flags = sealedName, flags|unix.MFD_ALLOW_SEALING
		}
		size := int64(parts[i].sizeMiB) << 20
		m, err := partMemfd(name, flags, size)
		if err != nil {
			return fail(err)
		}
		files[i] = m
		if _, err := copyData(m, f, 0, partOffset(parts, i), size, false); err != nil {
			return fail(err)
		}
		if !seal {
			continue
		}
		seals := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE | unix.F_SEAL_SEAL
		if _, err := unix.FcntlInt(m.Fd(), unix.F_ADD_SEALS, seals); err != nil {
			return fail(fmt.Errorf("seal: %w", err))
		}
	}
	return files, nil
}

// ramImages are this process's RAM image memfds.
var ramImages ramImageCache
