package rootfs

// A pure-Go erofs writer: it merges an image's layers (tar streams) in memory
// following the OCI layer changeset rules, as package unpack does on disk,
// and writes an uncompressed erofs image directly, so no unpacked tree is
// written to disk and read back by mkfs.erofs.
//
// On-disk format (fs/erofs/erofs_fs.h in Linux; https://erofs.docs.kernel.org):
// 4 KiB blocks, the 128-byte superblock at byte 1024, meta_blkaddr 0 (a nid
// is an absolute byte offset / 32), 64-byte extended inodes (per-file mtime,
// 32-bit uid/gid), data FLAT_PLAIN (all in consecutive blocks) or
// FLAT_INLINE (full blocks, then the tail right after the inode and its
// inline xattrs, in the same block), directories as sorted erofs_dirent
// blocks. Layout of the file:
//
//	block 0         superblock, root inode (nid 36) and its inline tail
//	blocks 1..      regular file data, in archive order
//	then            directory and long-symlink blocks
//	then            the other inodes, breadth first, with inline tails
//
// Data of files that a later layer deletes or replaces is punched out of
// the file (it stays sparse).

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/unpack"
)

const (
	blkBits      = 12
	blkSize      = 1 << blkBits
	sbOffset     = 1024
	erofsMagic   = 0xE0F5E1E2
	inodeSize    = 64 // erofs_inode_extended
	direntSize   = 12
	maxNameLen   = 255
	rootNid      = (sbOffset + 128) / 32
	layoutPlain  = 0
	layoutInline = 2
	// maxInlineTail bounds tails kept inline after their inode; larger ones
	// get a block of their own (it bounds the padding in the inode area).
	maxInlineTail = 2048
	// tailBudget bounds the file tails held in memory until the inodes are
	// written; past it, tails go to blocks of their own.
	tailBudget  = 64 << 20
	maxSymlinks = 255

	ftUnknown = 0
	ftReg     = 1
	ftDir     = 2
	ftFifo    = 5
	ftSymlink = 7

	xattrIndexUser     = 1
	xattrIndexSecurity = 6
)

// Whiteout prefixes from the OCI image spec (layer.md, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

type xattr struct {
	index uint8
	name  string // without the prefix of index
	value []byte
}

type inode struct {
	mode     uint32 // file type and permission bits (S_IF*, 07777)
	uid, gid uint32
	mtime    time.Time
	xattrs   []xattr
	size     int64
	blkaddr  uint32 // first data block (FLAT_PLAIN: all data; FLAT_INLINE: full blocks)
	nblocks  int64  // data blocks this inode owns in the data area
	tail     []byte // inline tail
	target   []byte // a symlink's target
	plain    bool   // data entirely in blocks (no inline tail)
	children map[string]*dirent

	// Set while laying out.
	seen   bool
	nlink  uint32
	nid    uint64
	ino    uint32
	parent *inode
	dir    []byte // directory content (dirent blocks)
}

func (n *inode) isDir() bool     { return n.mode&unix.S_IFMT == unix.S_IFDIR }
func (n *inode) isSymlink() bool { return n.mode&unix.S_IFMT == unix.S_IFLNK }

func (n *inode) fileType() uint8 {
	switch n.mode & unix.S_IFMT {
	case unix.S_IFREG:
		return ftReg
	case unix.S_IFDIR:
		return ftDir
	case unix.S_IFIFO:
		return ftFifo
	case unix.S_IFLNK:
		return ftSymlink
	}
	return ftUnknown
}

// dirent is a name in a directory; layer is the last layer that wrote it
// or something below it (opaque whiteouts keep those of their own layer).
type dirent struct {
	n     *inode
	layer int
}

type erofsWriter struct {
	f         *os.File
	w         *bufio.Writer
	off       int64 // end of the data written so far (block aligned)
	root      *inode
	layer     int
	note      func(string)
	tails     int64
	files     []*inode // inodes owning data blocks
	buildTime time.Time
}

func newErofsWriter(f *os.File, buildTime time.Time, note func(string)) *erofsWriter {
	w := &erofsWriter{f: f, w: bufio.NewWriterSize(f, 1<<20), off: blkSize, note: note, buildTime: buildTime}
	w.root = w.newDir(0o755, buildTime)
	return w
}

func (w *erofsWriter) notef(format string, args ...any) {
	if w.note != nil {
		w.note(fmt.Sprintf(format, args...))
	}
}

func (w *erofsWriter) newDir(perm uint32, mtime time.Time) *inode {
	return &inode{mode: unix.S_IFDIR | perm, mtime: mtime, children: map[string]*dirent{}}
}

// buildErofs writes img's root filesystem as an erofs image to f.
func buildErofs(ctx context.Context, store *image.Store, img *image.Image, f *os.File, note func(string)) error {
	layers, err := store.Layers(img)
	if err != nil {
		return err
	}
	bt := img.Created
	if bt.IsZero() || bt.Unix() < 0 {
		bt = time.Unix(0, 0)
	}
	// Block 0 (superblock, root inode) is written last.
	if _, err := f.Seek(blkSize, io.SeekStart); err != nil {
		return err
	}
	w := newErofsWriter(f, bt, note)
	for i, l := range layers {
		rc, err := l.Open()
		if err != nil {
			return fmt.Errorf("layer %d/%d %s: %w", i+1, len(layers), l.Digest, err)
		}
		ra := newReadahead(ctx, rc)
		w.layer = i
		err = w.apply(ctx, ra)
		if cerr := ra.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("layer %d/%d %s: %w", i+1, len(layers), l.Digest, err)
		}
	}
	var uuid [16]byte
	copy(uuid[:], strings.TrimPrefix(img.Digest, "sha256:"))
	return w.finish(uuid)
}

// apply merges one layer (an uncompressed tar stream) into the tree.
func (w *erofsWriter) apply(ctx context.Context, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read layer tar: %w", err)
		}
		if err := w.entry(hdr, tr); err != nil {
			return err
		}
	}
}

// cleanName turns a tar entry name into a clean relative slash path ("."
// for the root), refusing absolute names and names that climb out.
func cleanName(n string) (string, error) {
	if n == "" {
		return "", fmt.Errorf("empty entry name: %w", unpack.ErrUnsafePath)
	}
	if strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("absolute entry name %q: %w", n, unpack.ErrUnsafePath)
	}
	if strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("entry name %q contains NUL: %w", n, unpack.ErrUnsafePath)
	}
	p := path.Clean(n)
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("entry name %q leaves the root: %w", n, unpack.ErrUnsafePath)
	}
	return p, nil
}

// walk resolves the directory dir (a clean relative path, "." for the root)
// in the tree, following symlinks scoped to the root as
// github.com/cyphar/filepath-securejoin does ("/" and ".." stop at the
// root). With create, missing directories are made (0755, root-owned) and a
// non-directory in the way is an error; without, walk returns nil for both.
// It also returns the dirents walked through, for marking.
func (w *erofsWriter) walk(dir string, create bool, mtime time.Time) (*inode, []*dirent, error) {
	type step struct {
		n  *inode
		de *dirent
	}
	stack := []step{{w.root, nil}}
	var comps []string
	if dir != "." {
		comps = strings.Split(dir, "/")
	}
	links := 0
	for len(comps) > 0 {
		c := comps[0]
		comps = comps[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
			}
			continue
		}
		cur := stack[len(stack)-1].n
		de := cur.children[c]
		switch {
		case de == nil:
			if !create {
				return nil, nil, nil
			}
			if len(c) > maxNameLen {
				return nil, nil, fmt.Errorf("name %q is longer than %d bytes", c, maxNameLen)
			}
			de = &dirent{n: w.newDir(0o755, mtime), layer: w.layer}
			cur.children[c] = de
		case de.n.isSymlink():
			if links++; links > maxSymlinks {
				return nil, nil, fmt.Errorf("resolve %s: too many levels of symbolic links", dir)
			}
			target := string(de.n.target)
			if strings.HasPrefix(target, "/") {
				stack = stack[:1]
			}
			comps = append(strings.Split(target, "/"), comps...)
			continue
		case !de.n.isDir():
			if !create {
				return nil, nil, nil
			}
			return nil, nil, fmt.Errorf("resolve %s: %s is not a directory", dir, c)
		}
		stack = append(stack, step{de.n, de})
	}
	des := make([]*dirent, 0, len(stack))
	for _, s := range stack[1:] {
		des = append(des, s.de)
	}
	return stack[len(stack)-1].n, des, nil
}

func (w *erofsWriter) mark(des []*dirent) {
	for _, de := range des {
		de.layer = w.layer
	}
}

func (w *erofsWriter) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	base := path.Base(rel)
	dirRel := path.Dir(rel)

	// Whiteouts.
	if strings.HasPrefix(base, whiteoutPrefix) {
		par, des, err := w.walk(dirRel, false, hdr.ModTime)
		if err != nil || par == nil {
			return err
		}
		switch {
		case base == whiteoutOpaque:
			for name, de := range par.children {
				if de.layer != w.layer {
					delete(par.children, name)
				}
			}
			w.mark(des)
			return nil
		case strings.HasPrefix(base, whiteoutMeta):
			w.notef("skipped whiteout metadata entry %s", rel)
			return nil
		}
		victim := strings.TrimPrefix(base, whiteoutPrefix)
		if victim == "" || victim == "." || victim == ".." {
			return fmt.Errorf("bad whiteout %q: %w", hdr.Name, unpack.ErrUnsafePath)
		}
		delete(par.children, victim)
		return nil
	}

	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("entry %q for the root is not a directory: %w", hdr.Name, unpack.ErrUnsafePath)
		}
		w.meta(w.root, hdr)
		return nil
	}

	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		w.notef("skipped device node %s (%c %d:%d)", rel, hdr.Typeflag, hdr.Devmajor, hdr.Devminor)
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeRegA, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		w.notef("skipped %s: unsupported tar entry type %q", rel, hdr.Typeflag)
		return nil
	}
	if len(base) > maxNameLen {
		return fmt.Errorf("entry %q: name longer than %d bytes", hdr.Name, maxNameLen)
	}

	par, des, err := w.walk(dirRel, true, w.buildTime)
	if err != nil {
		return fmt.Errorf("create parent of %s: %w", rel, err)
	}

	// Hard-link source: resolved like any entry, final component not
	// followed.
	var linkSrc *dirent
	if hdr.Typeflag == tar.TypeLink {
		lrel, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link %s: %w", rel, err)
		}
		if lrel == "." {
			return fmt.Errorf("hard link %s to the root: %w", rel, unpack.ErrUnsafePath)
		}
		lpar, _, err := w.walk(path.Dir(lrel), false, w.buildTime)
		if err != nil {
			return fmt.Errorf("hard link %s: %w", rel, err)
		}
		if lpar != nil {
			linkSrc = lpar.children[path.Base(lrel)]
		}
		if linkSrc == nil {
			return fmt.Errorf("hard link %s -> %s: %w", rel, hdr.Linkname, fs.ErrNotExist)
		}
		if linkSrc.n.isDir() {
			return fmt.Errorf("hard link %s -> %s: target is a directory", rel, hdr.Linkname)
		}
	}

	w.mark(des)
	old := par.children[base]
	if hdr.Typeflag == tar.TypeDir && old != nil && old.n.isDir() {
		old.layer = w.layer
		w.meta(old.n, hdr)
		return nil
	}
	if linkSrc != nil {
		if linkSrc == old {
			old.layer = w.layer
			return nil
		}
		par.children[base] = &dirent{n: linkSrc.n, layer: w.layer}
		return nil
	}
	var n *inode
	switch hdr.Typeflag {
	case tar.TypeDir:
		n = w.newDir(0, hdr.ModTime)
	case tar.TypeReg, tar.TypeRegA:
		n = &inode{mode: unix.S_IFREG}
		if err := w.data(n, r, hdr.Size); err != nil {
			return fmt.Errorf("write %s: %w", rel, err)
		}
	case tar.TypeSymlink:
		if len(hdr.Linkname) >= blkSize {
			return fmt.Errorf("symlink %s: target longer than %d bytes", rel, blkSize-1)
		}
		// The target is stored as is; it is only resolved inside the
		// guest, or scoped to the root here.
		n = &inode{mode: unix.S_IFLNK | 0o777, target: []byte(hdr.Linkname), size: int64(len(hdr.Linkname))}
	case tar.TypeFifo:
		n = &inode{mode: unix.S_IFIFO}
	}
	w.meta(n, hdr)
	par.children[base] = &dirent{n: n, layer: w.layer}
	return nil
}

// meta applies owner, mode (with setuid/setgid/sticky), times and the
// user.* and security.* xattrs of hdr to n.
func (w *erofsWriter) meta(n *inode, hdr *tar.Header) {
	n.uid, n.gid = uint32(hdr.Uid), uint32(hdr.Gid)
	if !n.isSymlink() {
		n.mode = n.mode&unix.S_IFMT | uint32(hdr.Mode)&0o7777
	}
	n.mtime = hdr.ModTime
	var keys []string
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := strings.TrimPrefix(k, "SCHILY.xattr.")
		var x xattr
		switch {
		case strings.HasPrefix(name, "user."):
			x = xattr{index: xattrIndexUser, name: strings.TrimPrefix(name, "user.")}
		case strings.HasPrefix(name, "security."):
			x = xattr{index: xattrIndexSecurity, name: strings.TrimPrefix(name, "security.")}
		default:
			w.notef("skipped xattr %s on %s (only user.* and security.* are applied)", name, hdr.Name)
			continue
		}
		x.value = []byte(hdr.PAXRecords[k])
		if x.name == "" || len(x.name) > 255 || len(x.value) > 65535 {
			w.notef("skipped xattr %s on %s: name or value too long", name, hdr.Name)
			continue
		}
		replaced := false
		for i := range n.xattrs {
			if n.xattrs[i].index == x.index && n.xattrs[i].name == x.name {
				n.xattrs[i], replaced = x, true
			}
		}
		if !replaced {
			n.xattrs = append(n.xattrs, x)
		}
	}
	if xattrSize(n.xattrs) > blkSize/2 {
		w.notef("skipped the xattrs of %s: more than %d bytes", hdr.Name, blkSize/2)
		n.xattrs = nil
	}
}

// data copies size bytes of file content from r: whole blocks to the data
// area, the tail (size % block size) kept for inlining or padded to a block.
func (w *erofsWriter) data(n *inode, r io.Reader, size int64) error {
	n.size = size
	full := size &^ (blkSize - 1)
	tail := size - full
	n.blkaddr = uint32(w.off >> blkBits)
	if full > 0 {
		if _, err := io.CopyN(w.w, r, full); err != nil {
			return err
		}
		w.off += full
		n.nblocks = full >> blkBits
	}
	n.plain = true
	if tail > 0 {
		buf := make([]byte, tail)
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		if tail <= maxInlineTail && w.tails+tail <= tailBudget {
			n.tail, n.plain = buf, false
			w.tails += tail
		} else {
			var pad [blkSize]byte
			w.w.Write(buf)
			w.w.Write(pad[:blkSize-tail])
			w.off += blkSize
			n.nblocks++
		}
	}
	if n.nblocks > 0 {
		w.files = append(w.files, n)
	} else {
		n.blkaddr = 0
	}
	return nil
}

func xattrSize(xs []xattr) int {
	if len(xs) == 0 {
		return 0
	}
	sz := 12 // erofs_xattr_ibody_header
	for _, x := range xs {
		sz += (4 + len(x.name) + len(x.value) + 3) &^ 3
	}
	return sz
}

// finish lays out the directories and inodes and writes them and the
// superblock.
func (w *erofsWriter) finish(uuid [16]byte) error {
	// Breadth-first order from the root; link counts.
	order := []*inode{w.root}
	w.root.seen, w.root.parent = true, w.root
	for i := 0; i < len(order); i++ {
		d := order[i]
		if !d.isDir() {
			continue
		}
		d.nlink = 2
		names := make([]string, 0, len(d.children))
		for name := range d.children {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			c := d.children[name].n
			if c.isDir() {
				d.nlink++
			} else {
				c.nlink++
			}
			if !c.seen {
				c.seen, c.parent = true, d
				order = append(order, c)
			}
		}
		d.dir = dirBlocks(d, names)
	}
	// Data of files no longer in the tree: punch it out.
	if err := w.w.Flush(); err != nil {
		return err
	}
	for _, n := range w.files {
		if !n.seen {
			unix.Fallocate(int(w.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
				int64(n.blkaddr)<<blkBits, n.nblocks<<blkBits)
		}
	}

	// Directories and symlinks: their full blocks go after the file data;
	// a tail that does not fit inline makes the whole content plain.
	inlineMax := func(n *inode) int {
		m := blkSize - inodeSize - xattrSize(n.xattrs) - 1 // -1: a NUL after directory tails
		if n == w.root {
			m -= rootNid * 32
		}
		return min(m, maxInlineTail)
	}
	var extra []*inode
	alloc := w.off
	for _, n := range order {
		var content []byte
		switch {
		case n.isDir():
			content = n.dir
		case n.isSymlink():
			content = n.target
		default:
			continue
		}
		n.size = int64(len(content))
		full := len(content) &^ (blkSize - 1)
		tail := len(content) - full
		n.plain = tail == 0 || tail > inlineMax(n)
		if n.plain {
			full = len(content)
		}
		n.tail = content[full:]
		if len(n.tail) == 0 {
			n.tail = nil
		}
		n.blkaddr = 0
		if full > 0 {
			n.blkaddr = uint32(alloc >> blkBits)
			alloc += int64(full+blkSize-1) &^ (blkSize - 1)
			extra = append(extra, n)
		}
	}

	// Inodes: the root in block 0, the others from alloc on, each with its
	// xattrs and inline tail within one block.
	pos := alloc
	for i, n := range order {
		n.ino = uint32(i + 1)
		if n == w.root {
			n.nid = rootNid
			continue
		}
		need := int64(inodeSize + xattrSize(n.xattrs) + len(n.tail))
		if n.isDir() && len(n.tail) > 0 {
			need++
		}
		if pos%blkSize+need > blkSize {
			pos = (pos + blkSize - 1) &^ (blkSize - 1)
		}
		n.nid = uint64(pos / 32)
		pos = (pos + need + 31) &^ 31
	}

	// Directory contents need the nids (the inline tails share their
	// memory, so they are filled in too).
	for _, n := range order {
		if n.isDir() {
			fillNids(n)
		}
	}
	var zero [blkSize]byte
	for _, n := range extra {
		content := n.dir
		if n.isSymlink() {
			content = n.target
		}
		full := len(content) - len(n.tail)
		if int64(n.blkaddr)<<blkBits != w.off {
			return fmt.Errorf("erofs layout: block %d written at %d", n.blkaddr, w.off)
		}
		w.w.Write(content[:full])
		pad := (blkSize - full%blkSize) % blkSize
		w.w.Write(zero[:pad])
		w.off += int64(full + pad)
	}
	cur := w.off
	for _, n := range order {
		if n == w.root {
			continue
		}
		at := int64(n.nid) * 32
		if at > cur {
			w.w.Write(zero[:at-cur])
		}
		b := inodeBytes(n)
		w.w.Write(b)
		cur = at + int64(len(b))
	}
	end := (cur + blkSize - 1) &^ (blkSize - 1)
	w.w.Write(zero[:end-cur])
	if err := w.w.Flush(); err != nil {
		return err
	}

	// Block 0: superblock and root inode.
	blk0 := make([]byte, blkSize)
	sb := blk0[sbOffset:]
	le := binary.LittleEndian
	le.PutUint32(sb[0:], erofsMagic)
	sb[0xC] = blkBits
	le.PutUint16(sb[0xE:], uint16(rootNid))
	le.PutUint64(sb[0x10:], uint64(len(order)))
	le.PutUint64(sb[0x18:], uint64(max(w.buildTime.Unix(), 0)))
	le.PutUint32(sb[0x20:], uint32(w.buildTime.Nanosecond()))
	le.PutUint32(sb[0x24:], uint32(end>>blkBits))
	copy(sb[0x30:0x40], uuid[:])
	copy(sb[0x40:0x50], "airlock")
	copy(blk0[rootNid*32:], inodeBytes(w.root))
	if _, err := w.f.WriteAt(blk0, 0); err != nil {
		return err
	}
	if end>>blkBits > 1<<32-1 {
		return fmt.Errorf("root filesystem too large for erofs (%d blocks)", end>>blkBits)
	}
	return w.f.Truncate(end)
}

// dirBlocks packs the sorted names of d (with "." and "..") into directory
// blocks, leaving nids to fillNids. It returns the directory content: full
// blocks, then the used part of the last one.
func dirBlocks(d *inode, names []string) []byte {
	all := make([]string, 0, len(names)+2)
	all = append(all, names...)
	all = append(all, ".", "..")
	sort.Strings(all)
	var out []byte
	for i := 0; i < len(all); {
		j, used := i, 0
		for j < len(all) && used+direntSize+len(all[j]) <= blkSize {
			used += direntSize + len(all[j])
			j++
		}
		blk := make([]byte, used)
		nameoff := (j - i) * direntSize
		for k := i; k < j; k++ {
			e := blk[(k-i)*direntSize:]
			binary.LittleEndian.PutUint16(e[8:], uint16(nameoff))
			e[10] = ftDir
			if c := d.children[all[k]]; c != nil && all[k] != "." && all[k] != ".." {
				e[10] = c.n.fileType()
			}
			nameoff += copy(blk[nameoff:], all[k])
		}
		if j < len(all) {
			blk = append(blk, make([]byte, blkSize-used)...)
		}
		out = append(out, blk...)
		i = j
	}
	return out
}

// fillNids writes the nids into d's directory blocks.
func fillNids(d *inode) {
	for b := 0; b < len(d.dir); b += blkSize {
		blk := d.dir[b:min(b+blkSize, len(d.dir))]
		n := int(binary.LittleEndian.Uint16(blk[8:])) / direntSize
		for k := 0; k < n; k++ {
			e := blk[k*direntSize:]
			off := int(binary.LittleEndian.Uint16(e[8:]))
			end := len(blk)
			if k+1 < n {
				end = int(binary.LittleEndian.Uint16(e[direntSize+8:]))
			}
			name := string(blk[off:end])
			if k+1 == n {
				if z := strings.IndexByte(name, 0); z >= 0 {
					name = name[:z]
				}
			}
			var nid uint64
			switch name {
			case ".":
				nid = d.nid
			case "..":
				nid = d.parent.nid
			default:
				nid = d.children[name].n.nid
			}
			binary.LittleEndian.PutUint64(e[0:], nid)
		}
	}
}

// inodeBytes encodes n as an extended inode with its inline xattrs and
// tail.
func inodeBytes(n *inode) []byte {
	xs := xattrSize(n.xattrs)
	b := make([]byte, inodeSize+xs+len(n.tail))
	le := binary.LittleEndian
	layout := layoutInline
	if n.plain || len(n.tail) == 0 {
		layout = layoutPlain
	}
	le.PutUint16(b[0:], uint16(1|layout<<1))
	if xs > 0 {
		le.PutUint16(b[2:], uint16((xs-12)/4+1))
	}
	le.PutUint16(b[4:], uint16(n.mode))
	le.PutUint64(b[8:], uint64(n.size))
	if n.mode&unix.S_IFMT != unix.S_IFIFO {
		le.PutUint32(b[16:], n.blkaddr)
	}
	le.PutUint32(b[20:], n.ino)
	le.PutUint32(b[24:], n.uid)
	le.PutUint32(b[28:], n.gid)
	if s := n.mtime.Unix(); s > 0 {
		le.PutUint64(b[32:], uint64(s))
		le.PutUint32(b[40:], uint32(n.mtime.Nanosecond()))
	}
	le.PutUint32(b[44:], n.nlink)
	p := inodeSize
	if xs > 0 {
		p += 12 // ibody header: no shared xattrs
		for _, x := range n.xattrs {
			b[p] = uint8(len(x.name))
			b[p+1] = x.index
			le.PutUint16(b[p+2:], uint16(len(x.value)))
			copy(b[p+4:], x.name)
			copy(b[p+4+len(x.name):], x.value)
			p += (4 + len(x.name) + len(x.value) + 3) &^ 3
		}
	}
	copy(b[p:], n.tail)
	return b
}

// readahead decompresses a layer on another goroutine (another core), a
// few chunks ahead of the tar reader.
type readahead struct {
	rc     io.ReadCloser
	ch     chan []byte
	free   chan []byte
	errc   chan error
	cur    []byte
	buf    []byte
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

func newReadahead(ctx context.Context, rc io.ReadCloser) *readahead {
	ctx, cancel := context.WithCancel(ctx)
	r := &readahead{rc: rc, ch: make(chan []byte, 4), free: make(chan []byte, 6), errc: make(chan error, 1), cancel: cancel, done: make(chan struct{})}
	for i := 0; i < 6; i++ {
		r.free <- make([]byte, 256<<10)
	}
	go func() {
		defer close(r.done)
		defer close(r.ch)
		for {
			var b []byte
			select {
			case b = <-r.free:
			case <-ctx.Done():
				r.errc <- ctx.Err()
				return
			}
			n, err := io.ReadFull(rc, b)
			if n > 0 {
				select {
				case r.ch <- b[:n]:
				case <-ctx.Done():
					r.errc <- ctx.Err()
					return
				}
			}
			if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
				r.errc <- io.EOF
				return
			}
			if err != nil {
				r.errc <- err
				return
			}
		}
	}()
	return r
}

func (r *readahead) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.buf != nil {
			r.free <- r.buf[:cap(r.buf)]
			r.buf = nil
		}
		b, ok := <-r.ch
		if !ok {
			if r.err == nil {
				r.err = <-r.errc
			}
			return 0, r.err
		}
		r.buf, r.cur = b, b
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// Close stops the reader and closes the layer, returning its error (a
// digest mismatch shows up here).
func (r *readahead) Close() error {
	r.cancel()
	for range r.ch {
	}
	<-r.done
	if r.err == nil {
		select {
		case err := <-r.errc:
			if err != io.EOF && !errors.Is(err, context.Canceled) {
				r.err = err
			}
		default:
		}
	}
	err := r.rc.Close()
	if r.err != nil && r.err != io.EOF && !errors.Is(r.err, context.Canceled) {
		return r.err
	}
	return err
}
