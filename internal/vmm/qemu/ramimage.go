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

// A snapshot's RAM image (snapRAM) holds the guest RAM a box keeps in a
// memfd (ramLayout; THPCode and THPNone), as one sparse file of the
// guest's RAM size, each RAM part at its offset in RAM order. The save
// takes it straight from QEMU's memfds (only their allocated pages, never
// reading a hole) while the machine is stopped, and migrates with the
// capability x-ignore-shared, which leaves those (shared) RAM blocks out of
// the stream: the stream holds the device state only, and QEMU no longer
// reads every page of the box.
//
// A restore gives the box its own copy of the image (ramCopy), which its
// QEMU maps shared, as a booted box's memfds. Fork's children instead
// share one image and map it privately (memory-backend-file share=off):
// guest pages stay the image's until a child writes them. QEMU 7.2 opens
// a memory-backend-file read-write unless readonly=on, which also maps
// the guest RAM read-only (guest writes are lost), so a child could change
// a file it maps for its siblings; it maps a sealed memfd instead
// (F_SEAL_WRITE: no write(2), no shared writable mapping; private
// mappings work). Fork's snapshot is transient (vmm.SaveOptions.Transient):
// the save copies QEMU's memfds straight into such sealed memfds, which
// this process holds (ramImages) for the children and ramImageTTL after
// the last of them started, and writes no image file.

// snapRAM is the RAM image file of a snapshot directory.
const snapRAM = "ram"

// memfdName is how QEMU 7.2 names the memfds of its memory-backend-memfd
// objects (/proc/PID/fd links read "/memfd:memory-backend-memfd (deleted)");
// copyName is the name of a restored box's own copy of a RAM image
// (ramCopy), sealedName that of a sealed image Fork's children share.
const (
	memfdName  = "/memfd:memory-backend-memfd"
	copyName   = "airlock-ram-copy"
	sealedName = "airlock-ram-image"
)

// ramImageTTL is how long a transient snapshot's RAM image is kept after
// the last restore that used it.
const ramImageTTL = 30 * time.Second

// imageParts returns c's RAM parts (ramLayout) and the indices of those a
// RAM image can hold: all of them when guest RAM is in a memfd and the box
// has no virtio-fs share (whose shared RAM a snapshot cannot take: QEMU
// refuses to migrate vhost-user-fs); none otherwise.
func imageParts(c Config) ([]ramPart, []int) {
	if !c.THP.memfdRAM() || len(c.FSShares) > 0 {
		return nil, nil
	}
	mem := c.MemoryMiB
	if mem <= 0 {
		mem = 512
	}
	parts := ramLayout(mem)
	idx := make([]int, len(parts))
	for i := range parts {
		idx[i] = i
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
// parts (matched by size, which must differ between them). It
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

// ramImageCache keeps the sealed RAM images of this process's transient
// snapshots (Fork's), which the restores it starts from them share.
type ramImageCache struct {
	mu sync.Mutex
	m  map[ramImageKey]*ramImage
}

// ramImageKey identifies a snapshot's state file (which is written once
// and never changed), and so its RAM image.
type ramImageKey struct {
	dev, ino   uint64
	size, mtim int64
}

type ramImage struct {
	files []*os.File // by part index; nil for parts not in the image
	users int
	last  time.Time
}

// release returns what ends one use of im: after the last, im expires
// (once no use started for ramImageTTL).
func (c *ramImageCache) release(key ramImageKey, im *ramImage) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			im.users--
			im.last = time.Now()
			if im.users == 0 {
				time.AfterFunc(ramImageTTL, func() { c.expire(key, im) })
			}
		})
	}
}

// hold keeps files (a transient snapshot's RAM image, see sealedCopies)
// under key, the identity of the snapshot's state file, for the restores
// this process starts from it (lookup) and for ramImageTTL after the
// last of them.
func (c *ramImageCache) hold(key ramImageKey, files []*os.File) {
	im := &ramImage{files: files, users: 1}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[ramImageKey]*ramImage{}
	}
	c.m[key] = im // one it replaces closes when it expires
	c.mu.Unlock()
	c.release(key, im)()
}

// lookup returns the RAM image held under key (hold) and what the caller
// calls once QEMU holds it; ok is false when there is none (any longer).
func (c *ramImageCache) lookup(key ramImageKey) (files []*os.File, done func(), ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	im := c.m[key]
	if im == nil {
		return nil, nil, false
	}
	im.users++
	return im.files, c.release(key, im), true
}

// statKey is the cache key of a file with status st.
func statKey(st syscall.Stat_t) ramImageKey {
	return ramImageKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtim: st.Mtim.Nano()}
}

// expire closes im's memfds (QEMUs that map them keep them) if no restore
// used it for ramImageTTL.
func (c *ramImageCache) expire(key ramImageKey, im *ramImage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if im.users > 0 || time.Since(im.last) < ramImageTTL {
		return
	}
	if c.m[key] == im {
		delete(c.m, key)
	}
	closeAll(im.files) // one that hold replaced, too
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
// The copy runs in the background, while QEMU starts: QEMU writes nothing
// into guest RAM while it waits for an incoming migration (its loader's
// data is not copied in at reset then). filled waits for the copy and
// returns its error: the state must not load before it is complete (the
// load reads the virtqueues' rings in guest RAM).
func ramCopy(path string, parts []ramPart, idx []int) (files []*os.File, filled func() error, err error) {
	f, _, err := openImage(path, parts)
	if err != nil {
		return nil, nil, err
	}
	files, filled, err = fillInBackground(parts, idx, func(dst *os.File, i int) error {
		_, err := copyData(dst, f, 0, partOffset(parts, i), int64(parts[i].sizeMiB)<<20, false)
		if err != nil {
			return fmt.Errorf("load the snapshot's RAM image: %w", err)
		}
		return nil
	}, func() { f.Close() })
	return files, filled, err
}

// fillInBackground makes the memfds of the parts in idx (fillMemfds, empty)
// and fills each with fill in the background, while QEMU starts; filled
// waits for the fill and returns its error. done runs once the fill
// ends, or at once if the memfds cannot be made.
func fillInBackground(parts []ramPart, idx []int, fill func(dst *os.File, i int) error, done func()) (files []*os.File, filled func() error, err error) {
	files, err = fillMemfds(parts, idx, false, func(*os.File, int) error { return nil }) // filled below
	if err != nil {
		done()
		return nil, nil, err
	}
	end := make(chan error, 1)
	go func() {
		defer done()
		for _, i := range idx {
			if err := fill(files[i], i); err != nil {
				end <- err
				return
			}
		}
		end <- nil
	}()
	var once sync.Once
	var ferr error
	return files, func() error {
		once.Do(func() { ferr = <-end })
		return ferr
	}, nil
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

// sealedCopies makes a sealed copy of each of QEMU's RAM memfds (by part
// index): the RAM image of a transient snapshot, held in memory. Zero
// pages are left out, as in writeRAMImage. It returns the copies and the
// bytes of data in them.
func sealedCopies(parts []ramPart, memfds map[int]*os.File) ([]*os.File, int64, error) {
	idx := make([]int, 0, len(memfds))
	for i := range parts {
		if memfds[i] != nil {
			idx = append(idx, i)
		}
	}
	var n int64
	files, err := fillMemfds(parts, idx, true, func(m *os.File, i int) error {
		c, err := copyData(m, memfds[i], 0, 0, int64(parts[i].sizeMiB)<<20, true)
		n += c
		return err
	})
	return files, n, err
}

// fillMemfds makes one memfd per part in idx (by part index, len(parts)),
// sized to the part, has fill write it, and seals it with seal.
func fillMemfds(parts []ramPart, idx []int, seal bool, fill func(m *os.File, i int) error) ([]*os.File, error) {
	files := make([]*os.File, len(parts))
	fail := func(err error) ([]*os.File, error) {
		closeAll(files)
		return nil, fmt.Errorf("load the snapshot's RAM image: %w", err)
	}
	for _, i := range idx {
		name, flags := copyName, unix.MFD_CLOEXEC
		if seal {
			name, flags = sealedName, flags|unix.MFD_ALLOW_SEALING
		}
		m, err := partMemfd(name, flags, int64(parts[i].sizeMiB)<<20)
		if err != nil {
			return fail(err)
		}
		files[i] = m
		if err := fill(m, i); err != nil {
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
