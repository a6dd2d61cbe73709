package rootfs

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/scratch"
)

// UpperDir is the overlayfs upper directory inside a box's writable layer
// (the guest mounts the disk at /mnt/rw: upperdir=/mnt/rw/upper).
const UpperDir = "/upper"

// LayerStats describes the layer UpperLayer wrote.
type LayerStats struct {
	// Entries is the number of tar entries written, whiteouts included;
	// Whiteouts counts the deletions and opaque directories among them.
	Entries, Whiteouts int
	// Bytes is the size of the regular files' contents.
	Bytes int64
	// Skipped lists what was left out (device nodes, sockets, fifos).
	Skipped []string
}

// maxDepth bounds how deep UpperLayer walks (a tar path also has to fit
// PATH_MAX when it is unpacked).
const maxDepth = 256

// UpperLayer writes the overlayfs upper directory of the writable layer
// disk (a box's rw.ext4, which nothing may be writing) to w as an
// uncompressed OCI image layer: files, directories, symlinks and hard
// links with their modes, owners and mtimes; a whiteout (character device
// 0:0) becomes an empty ".wh.NAME" file and an opaque directory
// (trusted.overlay.opaque=y) gets a ".wh..wh..opq" entry, as the OCI image
// spec's changesets have it. user.* and security.* extended attributes
// (file capabilities) are carried as PAX SCHILY.xattr records; device
// nodes, fifos and sockets are left out (LayerStats.Skipped).
//
// It needs no root and mounts nothing: it copies the disk to a scratch
// directory next to scratchDir, replays its journal there (e2fsck -E
// journal_only) and reads it with debugfs (e2fsprogs), by inode number
// (file contents stream from "cat <inode>" straight into the tar), so
// that no name from the disk becomes a host path. The disk is guest
// controlled: names with '/' or NUL, directory cycles, deeper than 256
// levels, and more than lim allows (entries, bytes, one file's size) are
// refused with an error (wrapping unpack.ErrLimit for the limits); zero
// limits default from scratchDir's free space (unpack.DefaultLimits).
func UpperLayer(ctx context.Context, disk, scratchDir string, w io.Writer, lim unpack.Limits) (LayerStats, error) {
	return UpperLayerWith(ctx, disk, scratchDir, w, lim, nil)
}

// ToolRunner prepares each run of e2fsck and debugfs on a box's disk
// before it starts; a crafted file system attacks those tools, so airlock
// runs them confined. The command works in cmd.Dir, a directory of its own
// that holds the disk's copy, the command file and the files the tool
// writes, and names them relative to it (cmd.Path is the tool, cmd.Args[1:]
// its arguments): the runner may change the command's credentials and
// namespaces, or make it a launcher that execs the tool. An error stops
// the read with that error.
type ToolRunner func(cmd *exec.Cmd) error

// UpperLayerWith is UpperLayer with each e2fsprogs run prepared by tool
// (nil: run as they are).
func UpperLayerWith(ctx context.Context, disk, scratchDir string, w io.Writer, lim unpack.Limits, tool ToolRunner) (LayerStats, error) {
	var st LayerStats
	debugfs, err := exec.LookPath("debugfs")
	if err != nil {
		return st, errors.New("debugfs not found: install e2fsprogs (apt-get install e2fsprogs) to read a box's writable layer")
	}
	e2fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		return st, errors.New("e2fsck not found: install e2fsprogs (apt-get install e2fsprogs)")
	}
	def := unpack.DefaultLimits(scratchDir)
	if lim.MaxBytes == 0 {
		lim.MaxBytes = def.MaxBytes
	}
	if lim.MaxFileSize == 0 {
		lim.MaxFileSize = min(lim.MaxBytes, def.MaxFileSize)
	}
	if lim.MaxEntries == 0 {
		lim.MaxEntries = def.MaxEntries
	}
	tmp, err := scratch.MkdirTemp(scratchDir, "upper")
	if err != nil {
		return st, err
	}
	defer os.RemoveAll(tmp)
	if strings.ContainsAny(tmp, "\"\n") {
		return st, fmt.Errorf("scratch directory %q: debugfs cannot take a path with '\"' or a newline", tmp)
	}
	img := filepath.Join(tmp, diskName)
	if err := CopyDisk(disk, img); err != nil {
		return st, fmt.Errorf("copy the writable layer: %w", err)
	}
	// A box that was killed, or a copy of a running one's disk, has a
	// journal to replay; exit status 1 means it was.
	fctx, cancel := context.WithTimeout(ctx, fsckTimeout)
	defer cancel()
	fsck := exec.CommandContext(fctx, e2fsck, "-p", "-E", "journal_only", diskName)
	fsck.Dir = tmp
	if tool != nil {
		if err := tool(fsck); err != nil {
			return st, fmt.Errorf("e2fsck on the writable layer: %w", err)
		}
	}
	fsckOut := &capBuffer{max: maxToolMessage}
	fsck.Stdout, fsck.Stderr = fsckOut, fsckOut
	if err := fsck.Run(); err != nil {
		out := fsckOut.String()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			return st, fmt.Errorf("e2fsck -E journal_only on the writable layer: %w: %s", err, strings.TrimSpace(out))
		}
	}
	d := &debugfsRunner{bin: debugfs, dir: tmp, tool: tool}
	root, err := d.rootInode(ctx)
	if err != nil {
		return st, err
	}
	if root == 0 {
		// A box that never booted has no upper directory: an empty layer.
		return st, tar.NewWriter(w).Close()
	}
	tw := tar.NewWriter(w)
	seenDir := map[uint64]bool{root: true}
	links := map[uint64]string{} // inode of a regular file -> its first path
	type dirAt struct {
		ino  uint64
		path string
	}
	level := []dirAt{{root, ""}}
	for depth := 0; len(level) > 0; depth++ {
		if depth > maxDepth {
			return st, fmt.Errorf("the writable layer is deeper than %d directories: %w", maxDepth, unpack.ErrLimit)
		}
		var next []dirAt
		// Directories and entries go in chunks, so that what debugfs
		// prints, and the files it dumps, stay small at any one time.
		for len(level) > 0 {
			dirs := level[:min(len(level), dirChunk)]
			level = level[len(dirs):]
			cmds := make([]string, len(dirs))
			for i, dir := range dirs {
				cmds[i] = fmt.Sprintf("ls -p <%d>", dir.ino)
			}
			lists, err := d.run(ctx, cmds)
			if err != nil {
				return st, err
			}
			var ents []lsEntry
			for i, dir := range dirs {
				es, err := parseLs(lists[i])
				if err != nil {
					return st, fmt.Errorf("directory %q of the writable layer: %w", "/"+dir.path, err)
				}
				if int64(st.Entries+len(ents)+len(es)) > lim.MaxEntries {
					return st, fmt.Errorf("the writable layer has more than %d entries: %w", lim.MaxEntries, unpack.ErrLimit)
				}
				for _, e := range es {
					e.path = path.Join(dir.path, e.name)
					ents = append(ents, e)
				}
			}
			lists = nil
			for len(ents) > 0 {
				chunk := ents[:min(len(ents), entryChunk)]
				ents = ents[len(chunk):]
				sub, err := upperChunk(ctx, tw, d, chunk, links, seenDir, lim, &st)
				if err != nil {
					return st, err
				}
				for _, e := range sub {
					next = append(next, dirAt{e.ino, e.path})
				}
			}
		}
		level = next
	}
	return st, tw.Close()
}

// Chunk sizes of UpperLayer's debugfs batches: directories listed, and
// entries stat'ed and dumped, per debugfs run.
const (
	dirChunk   = 256
	entryChunk = 2048
)

// upperChunk stats the entries ents, dumps their contents and extended
// attributes, writes them to tw and removes the dumped files again; it
// returns the directories among them.
func upperChunk(ctx context.Context, tw *tar.Writer, d *debugfsRunner, ents []lsEntry, links map[uint64]string,
	seenDir map[uint64]bool, lim unpack.Limits, st *LayerStats) ([]lsEntry, error) {
	batch := make([]string, len(ents))
	for i, e := range ents {
		batch[i] = fmt.Sprintf("stat <%d>", e.ino)
	}
	stats, err := d.run(ctx, batch)
	if err != nil {
		return nil, err
	}
	defer d.clean()
	var dirs []lsEntry
	var dump, cats []string
	dumpFor := map[int]bool{}
	cat := map[int]int{} // entry -> its cat command
	for i, e := range ents {
		si := parseStat(stats[i])
		ents[i].st = si
		if _, linked := links[e.ino]; !linked && e.mode&0o170000 != 0o020000 {
			for j, name := range si.xattrs {
				dump = append(dump, fmt.Sprintf(`ea_get -f "%s" <%d> %s`, xattrName(e.ino, j), e.ino, name))
			}
		}
		switch e.mode & 0o170000 {
		case 0o100000:
			if _, ok := links[e.ino]; ok {
				continue
			}
			if e.size > lim.MaxFileSize {
				return nil, fmt.Errorf("%s in the writable layer is %d bytes, over the limit of %d: %w", e.path, e.size, lim.MaxFileSize, unpack.ErrLimit)
			}
			if st.Bytes+e.size > lim.MaxBytes {
				return nil, fmt.Errorf("the writable layer's files add up to more than %d bytes: %w", lim.MaxBytes, unpack.ErrLimit)
			}
			st.Bytes += e.size
			links[e.ino] = e.path
			dumpFor[i] = true
			cat[i] = len(cats)
			cats = append(cats, fmt.Sprintf("cat <%d>", e.ino))
		case 0o120000:
			if !si.fastLink {
				if e.size > 4096 {
					return nil, fmt.Errorf("symlink %s in the writable layer is longer than 4096 bytes: %w", e.path, unpack.ErrLimit)
				}
				cat[i] = len(cats)
				cats = append(cats, fmt.Sprintf("cat <%d>", e.ino))
			}
		case 0o040000:
			if seenDir[e.ino] {
				return nil, fmt.Errorf("directory %s of the writable layer is linked twice (a damaged filesystem)", e.path)
			}
			seenDir[e.ino] = true
			dirs = append(dirs, e)
		}
	}
	if _, err := d.run(ctx, dump); err != nil {
		return nil, err
	}
	// Contents stream from one debugfs: each cat's output follows its
	// echoed command, exactly the file's size long.
	err = d.stream(ctx, cats, func(next func(int) (io.Reader, error)) error {
		for i, e := range ents {
			if err := ctx.Err(); err != nil {
				return err
			}
			var content io.Reader
			if c, ok := cat[i]; ok {
				if content, err = next(c); err != nil {
					return fmt.Errorf("read %s from the writable layer: %w", e.path, err)
				}
			}
			if err := writeEntry(tw, d, e, links, dumpFor[i], content, st); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return dirs, nil
}

// lsEntry is one line of debugfs "ls -p" with what stat added.
type lsEntry struct {
	ino      uint64
	mode     int64
	uid, gid int
	name     string
	size     int64
	path     string
	st       statInfo
}

// writeEntry writes e to tw; content is the stream positioned at e's
// content (debugfs cat) when e has one: a regular file's first name, a
// slow symlink.
func writeEntry(tw *tar.Writer, d *debugfsRunner, e lsEntry, links map[uint64]string, dumped bool, content io.Reader, st *LayerStats) error {
	hdr := &tar.Header{Name: e.path, Mode: e.mode & 0o7777, Uid: e.uid, Gid: e.gid, ModTime: e.st.mtime, Format: tar.FormatPAX}
	for j, name := range e.st.xattrs {
		if e.mode&0o170000 == 0o100000 && !dumped {
			break // a hard link: the first name carries them
		}
		v, err := readDumped(filepath.Join(d.dir, xattrName(e.ino, j)), 64<<10)
		if err != nil {
			continue // debugfs could not read it (or it is no xattr)
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+name] = string(v)
	}
	if strings.HasPrefix(e.name, ".wh.") {
		return fmt.Errorf("%s in the writable layer has a name OCI image layers reserve for whiteouts (.wh.*): rename it to commit", e.path)
	}
	switch e.mode & 0o170000 {
	case 0o100000:
		if first := links[e.ino]; !dumped {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			break
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, e.size
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		st.Entries++
		if n, err := io.CopyN(tw, content, e.size); err != nil {
			return fmt.Errorf("read %s from the writable layer: got %d bytes of %d: %w", e.path, n, e.size, err)
		}
		return nil
	case 0o040000:
		if e.st.redirect {
			return fmt.Errorf("directory %s of the writable layer was renamed (overlay redirect): commit cannot express that; copy it instead of renaming", e.path)
		}
		hdr.Typeflag, hdr.Name = tar.TypeDir, e.path+"/"
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		st.Entries++
		if e.st.opaque {
			st.Entries++
			st.Whiteouts++
			return tw.WriteHeader(&tar.Header{Name: e.path + "/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: e.st.mtime, Format: tar.FormatPAX})
		}
		return nil
	case 0o120000:
		hdr.Typeflag = tar.TypeSymlink
		if e.st.fastLink {
			hdr.Linkname = e.st.linkDest
		} else {
			b := make([]byte, e.size)
			if _, err := io.ReadFull(content, b); err != nil {
				return fmt.Errorf("read symlink %s from the writable layer: %w", e.path, err)
			}
			hdr.Linkname = string(b)
		}
		if strings.ContainsRune(hdr.Linkname, 0) {
			return fmt.Errorf("symlink %s in the writable layer has a NUL in its target", e.path)
		}
	case 0o020000:
		if e.st.rdev == 0 {
			st.Entries++
			st.Whiteouts++
			return tw.WriteHeader(&tar.Header{Name: path.Join(path.Dir(e.path), ".wh."+e.name), Typeflag: tar.TypeReg, Mode: 0o644, ModTime: e.st.mtime, Format: tar.FormatPAX})
		}
		st.Skipped = append(st.Skipped, e.path+" (character device)")
		return nil
	default:
		st.Skipped = append(st.Skipped, fmt.Sprintf("%s (file type %o)", e.path, e.mode&0o170000))
		return nil
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	st.Entries++
	return nil
}

// parseLs parses debugfs "ls -p" output: "/INODE/MODE/UID/GID/NAME/SIZE/"
// per entry, "." and ".." left out.
func parseLs(out string) ([]lsEntry, error) {
	var es []lsEntry
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, "/")
		if len(f) < 8 || f[0] != "" || f[len(f)-1] != "" {
			return nil, fmt.Errorf("unexpected debugfs output %q", line)
		}
		if len(f) > 8 {
			return nil, fmt.Errorf("a name with '/' in it (%q): a damaged filesystem", line)
		}
		ino, err1 := strconv.ParseUint(f[1], 10, 32)
		mode, err2 := strconv.ParseInt(f[2], 8, 32)
		uid, err3 := strconv.Atoi(f[3])
		gid, err4 := strconv.Atoi(f[4])
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("unexpected debugfs output %q: %w", line, err)
		}
		e := lsEntry{ino: ino, mode: mode, uid: uid, gid: gid, name: f[5]}
		if e.name == "." || e.name == ".." {
			continue
		}
		if e.name == "" || strings.ContainsRune(e.name, 0) {
			return nil, fmt.Errorf("an empty name or one with NUL (%q): a damaged filesystem", line)
		}
		if f[6] != "" {
			if e.size, err1 = strconv.ParseInt(f[6], 10, 64); err1 != nil || e.size < 0 {
				return nil, fmt.Errorf("unexpected debugfs output %q", line)
			}
		}
		es = append(es, e)
	}
	return es, nil
}

// statInfo is what UpperLayer needs of debugfs "stat".
type statInfo struct {
	mtime            time.Time
	rdev             uint64
	fastLink         bool
	linkDest         string
	opaque, redirect bool
	// xattrs are the names of the user.* and security.* attributes
	// (carried into the layer).
	xattrs []string
}

// carriedXattr matches the extended attribute names a layer carries:
// user.* and security.* (file capabilities, SELinux labels), with names
// debugfs takes as one argument.
var carriedXattr = regexp.MustCompile(`^(user|security)\.[A-Za-z0-9._@+-]{1,200}$`)

// maxXattrs bounds the extended attributes carried per file.
const maxXattrs = 32

func parseStat(out string) statInfo {
	var si statInfo
	inXattr := false
	for _, line := range strings.Split(out, "\n") {
		if inXattr {
			if strings.HasPrefix(line, "  ") {
				name, val, _ := strings.Cut(strings.TrimSpace(line), " (")
				_, val, _ = strings.Cut(val, " = ")
				switch name {
				case "trusted.overlay.opaque":
					si.opaque = val == `"y"`
				case "trusted.overlay.redirect":
					si.redirect = true
				default:
					if carriedXattr.MatchString(name) && len(si.xattrs) < maxXattrs {
						si.xattrs = append(si.xattrs, name)
					}
				}
				continue
			}
			inXattr = false
		}
		switch {
		case strings.HasPrefix(line, " mtime: 0x"):
			// " mtime: 0xSECONDS:EXTRA -- date": EXTRA holds the epoch
			// bits (low 2) and the nanoseconds.
			v, _, _ := strings.Cut(strings.TrimPrefix(line, " mtime: 0x"), " ")
			s, x, _ := strings.Cut(v, ":")
			sec, _ := strconv.ParseUint(s, 16, 32)
			extra, _ := strconv.ParseUint(x, 16, 32)
			si.mtime = time.Unix(int64(int32(sec))+int64(extra&3)<<32, int64(extra>>2)).UTC()
		case strings.HasPrefix(line, "Extended attributes:"):
			inXattr = true
		case strings.Contains(line, "Device major/minor number: "):
			_, v, _ := strings.Cut(line, "number: ")
			v, _, _ = strings.Cut(v, " ")
			ma, mi, _ := strings.Cut(v, ":")
			a, _ := strconv.ParseUint(ma, 16, 32)
			b, _ := strconv.ParseUint(mi, 16, 32)
			si.rdev = a<<20 | b
		case strings.HasPrefix(line, "Fast link dest: \""):
			si.fastLink = true
			si.linkDest = strings.TrimSuffix(strings.TrimPrefix(line, "Fast link dest: \""), "\"")
		}
	}
	return si
}

// debugfsRunner runs batches of debugfs commands on one image.
type debugfsRunner struct {
	bin, dir string
	tool     ToolRunner
}

// diskName is the name, relative to debugfsRunner.dir (the tools' working
// directory), of the disk's copy.
const diskName = "disk.ext4"

// command returns the debugfs run of cmds on the disk's copy (read-only,
// catastrophic mode: bitmaps are not read), prepared by the runner's tool.
// The commands go on debugfs's standard input, not in a file: the tool may
// run as a uid that owns its working directory, and code that took it
// over could leave a symlink where the host would write the next batch.
func (d *debugfsRunner) command(ctx context.Context, cmds []string) (*exec.Cmd, error) {
	cmd := exec.CommandContext(ctx, d.bin, "-c", "-f", "-", diskName)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	cmd.Dir = d.dir
	if d.tool != nil {
		if err := d.tool(cmd); err != nil {
			return nil, fmt.Errorf("debugfs on the writable layer: %w", err)
		}
	}
	return cmd, nil
}

// stream runs cmds (cat commands) in one debugfs and calls fn with next:
// next(i) checks that command i is the next one echoed and returns the
// stream positioned at its output, which the caller reads exactly (a
// file's size). Afterwards the output must be at its end.
func (d *debugfsRunner) stream(ctx context.Context, cmds []string, fn func(next func(int) (io.Reader, error)) error) error {
	if len(cmds) == 0 {
		return fn(func(int) (io.Reader, error) { return nil, errors.New("no content expected") })
	}
	ctx, cancel := context.WithTimeout(ctx, debugfsTimeout)
	defer cancel()
	cmd, err := d.command(ctx, cmds)
	if err != nil {
		return err
	}
	stderr := &capBuffer{max: maxToolMessage}
	cmd.Stderr = stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	r := bufio.NewReaderSize(pipe, 1<<20)
	want := 0
	next := func(i int) (io.Reader, error) {
		if i != want {
			return nil, fmt.Errorf("contents out of order (%d, want %d)", i, want)
		}
		want++
		line, err := r.ReadString('\n')
		if line != "debugfs: "+cmds[i]+"\n" {
			return nil, fmt.Errorf("debugfs printed %.80q where %q was expected (%v): %s", line, cmds[i], err, strings.TrimSpace(stderr.String()))
		}
		return r, nil
	}
	ferr := fn(next)
	if ferr == nil && want != len(cmds) {
		ferr = fmt.Errorf("read %d of %d contents", want, len(cmds))
	}
	if ferr == nil {
		if n, _ := io.Copy(io.Discard, io.LimitReader(r, 1)); n != 0 {
			ferr = fmt.Errorf("debugfs printed more than the files' sizes (a file shorter than its size?): %s", strings.TrimSpace(stderr.String()))
		}
	}
	if ferr != nil {
		cmd.Process.Kill()
	}
	werr := cmd.Wait()
	if ferr != nil {
		return ferr
	}
	if werr != nil {
		return fmt.Errorf("debugfs on the writable layer: %w: %s", werr, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// clean removes the files dumped so far.
func (d *debugfsRunner) clean() {
	ents, _ := os.ReadDir(d.dir)
	for _, e := range ents {
		if n := e.Name(); n != diskName {
			os.Remove(filepath.Join(d.dir, n))
		}
	}
}

// readDumped reads a file the tool wrote, of at most max bytes. The tool
// may run as another uid, and code that took it over could leave a
// symlink, a fifo or a hard link there instead: only a regular file with
// one link is read, without following a symlink or blocking.
func readDumped(p string, max int64) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || !ok || st.Nlink != 1 {
		return nil, fmt.Errorf("%s is not a regular file of its own", p)
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", p, max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("%s is larger than %d bytes", p, max)
	}
	return b, err
}

// xattrName is the name (in the runner's directory) of the file debugfs
// dumps extended attribute i of inode ino to.
func xattrName(ino uint64, i int) string { return fmt.Sprintf("x%d-%d", ino, i) }

// rootInode returns the inode of UpperDir, 0 if there is none.
func (d *debugfsRunner) rootInode(ctx context.Context) (uint64, error) {
	out, err := d.run(ctx, []string{"ls -p /"})
	if err != nil {
		return 0, err
	}
	es, err := parseLs(out[0])
	if err != nil {
		return 0, fmt.Errorf("the writable layer's root: %w", err)
	}
	for _, e := range es {
		if e.name == strings.TrimPrefix(UpperDir, "/") {
			if e.mode&0o170000 != 0o040000 {
				return 0, fmt.Errorf("%s in the writable layer is not a directory", UpperDir)
			}
			return e.ino, nil
		}
	}
	return 0, nil
}

// maxDebugfsOutput bounds what one batch may print (stat prints about 1 KiB
// an entry; a listing about 30 bytes an entry).
const maxDebugfsOutput = 256 << 20

// Deadlines for the e2fsprogs runs on a (possibly crafted) filesystem.
const (
	fsckTimeout    = 5 * time.Minute
	debugfsTimeout = 10 * time.Minute
)

// run runs cmds in one debugfs (read-only, catastrophic mode: bitmaps are
// not read) and returns each command's output. debugfs echoes each
// command as "debugfs: CMD" before its output.
func (d *debugfsRunner) run(ctx context.Context, cmds []string) ([]string, error) {
	outs := make([]string, len(cmds))
	if len(cmds) == 0 {
		return outs, nil
	}
	ctx, cancel := context.WithTimeout(ctx, debugfsTimeout)
	defer cancel()
	cmd, err := d.command(ctx, cmds)
	if err != nil {
		return nil, err
	}
	stderr := &capBuffer{max: maxToolMessage}
	cmd.Stderr = stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	i := -1
	var cur strings.Builder
	var total int64
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var perr error
	for sc.Scan() {
		line := sc.Text()
		total += int64(len(line)) + 1
		if total > maxDebugfsOutput {
			perr = fmt.Errorf("debugfs printed more than %d bytes: %w", maxDebugfsOutput, unpack.ErrLimit)
			break
		}
		// A name could hold "\ndebugfs: ..." itself: only the next
		// expected command counts as the start of the next output.
		if i+1 < len(cmds) && line == "debugfs: "+cmds[i+1] {
			if i >= 0 {
				outs[i] = cur.String()
			}
			i++
			cur.Reset()
			continue
		}
		if i >= 0 {
			cur.WriteString(line)
			cur.WriteByte('\n')
		}
	}
	if i >= 0 {
		outs[i] = cur.String()
	}
	if perr == nil {
		perr = sc.Err()
	}
	if perr != nil {
		cmd.Process.Kill()
	}
	werr := cmd.Wait()
	if perr != nil {
		return nil, perr
	}
	if werr != nil {
		return nil, fmt.Errorf("debugfs on the writable layer: %w: %s", werr, strings.TrimSpace(stderr.String()))
	}
	if i != len(cmds)-1 {
		return nil, fmt.Errorf("debugfs on the writable layer ran %d of %d commands: %s", i+1, len(cmds), strings.TrimSpace(stderr.String()))
	}
	return outs, nil
}

// maxToolMessage bounds what is kept of an e2fsprogs run's messages
// (stderr; e2fsck's output): the tool reads a disk the guest wrote, and
// code that took it over could print without end.
const maxToolMessage = 64 << 10

// capBuffer keeps the first max bytes written to it and drops the rest.
type capBuffer struct {
	max int
	buf bytes.Buffer
}

func (c *capBuffer) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (c *capBuffer) String() string { return c.buf.String() }
