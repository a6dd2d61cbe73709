// Package rootfs builds the disks a box's root filesystem is made of: a
// read-only erofs base per image digest and a per-box writable ext4 disk
// (attached after the agent disk: /dev/vdb and /dev/vdc); the guest combines them with
// overlayfs.
//
// Bases live in CACHE/rootfs/<manifest digest hex>.erofs, where CACHE is
// the cache directory the caller gives (defaults.Cache() for the CLI).
package rootfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/flock"
	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/sparse"
)

// BaseOptions tunes BaseWith. The zero value is ready to use.
type BaseOptions struct {
	// Note, if not nil, receives notes from applying the layers (skipped
	// device nodes and the like) and a line when a base is built.
	Note func(msg string)
	// Limits bound what the image may unpack to (unpack.Limits; zero
	// fields default from the cache's free space): past one the build
	// fails with an error wrapping unpack.ErrLimit and leaves nothing.
	Limits unpack.Limits
}

// checkFreeSpace fails when dir's filesystem cannot hold the base of img:
// its layers, unpacked (counted as twice their compressed size, the least
// they usually grow), plus the erofs image of them, plus a reserve.
func checkFreeSpace(store *image.Store, img *image.Image, dir string) error {
	layers, err := store.Layers(img)
	if err != nil {
		return err
	}
	var compressed int64
	for _, l := range layers {
		compressed += l.Size
	}
	need := 4*compressed + 256<<20
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil // cannot tell: the unpack limits still apply
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < need {
		return fmt.Errorf("not enough free space in %s to build the root filesystem of %s: %d MiB free, at least %d MiB needed (free some space there, or remove images no box uses)", dir, img.Ref, free>>20, need>>20)
	}
	return nil
}

// Base returns the path of the erofs root filesystem base for img,
// cacheDir/rootfs/<digest hex>-<recipe>.erofs, building it first if it is
// missing or damaged (a truncated file, as a crash can leave); a base of an
// older recipe is replaced.
//
// The layers are applied oldest first to a temporary folder by package
// unpack (OCI changeset rules: whiteouts, opaque directories, hard links
// across layers; entries that climb out of the root are refused with
// unpack.ErrUnsafePath, symlinks in parent paths are resolved inside the
// root, device nodes are skipped), InitLayer adds the /etc files the box
// gets from the agent, and mkfs.erofs from erofs-utils turns
// that folder into an uncompressed erofs image. Owners are kept when running
// as root; otherwise every file is owned by root (--all-root). Modes,
// mtimes and user.*/security.* xattrs come from the layers. The image is
// written beside its final name and renamed into place; the folder is
// removed. Concurrent callers, in this or other processes, build each
// digest once (flock on <digest hex>.lock). cacheDir must be given.
// Cancelling ctx stops the build and leaves no partial
// base.
//
// erofs-utils 1.5 (Debian bookworm) cannot read tar streams; with
// erofs-utils >= 1.7, mkfs.erofs --tar could take the layers directly and
// the unpack step (most of the build time) would go away.
func Base(ctx context.Context, store *image.Store, img *image.Image, cacheDir string) (string, error) {
	return BaseWith(ctx, store, img, cacheDir, BaseOptions{})
}

// BaseWith is Base with options.
func BaseWith(ctx context.Context, store *image.Store, img *image.Image, cacheDir string, opts BaseOptions) (string, error) {
	if cacheDir == "" {
		return "", errors.New("rootfs: no cache directory given")
	}
	hexd, ok := strings.CutPrefix(img.Digest, "sha256:")
	if !ok || len(hexd) != 64 {
		return "", fmt.Errorf("image %s: unexpected digest %q", img.Ref, img.Digest)
	}
	dir := filepath.Join(cacheDir, "rootfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	final := filepath.Join(dir, baseName(hexd))
	if validBase(final) {
		return final, nil
	}
	l := flock.New(filepath.Join(dir, hexd+".lock"))
	if _, err := l.TryLockContext(ctx, 100*time.Millisecond); err != nil {
		return "", fmt.Errorf("lock rootfs base %s: %w", hexd, err)
	}
	defer l.Unlock()
	if validBase(final) {
		return final, nil
	}

	if err := checkFreeSpace(store, img, dir); err != nil {
		return "", err
	}
	start := time.Now()
	tree, err := os.MkdirTemp(dir, ".build-"+hexd[:12]+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tree)
	tmpImg := filepath.Join(tree, "base.erofs")
	if err := mkfsBase(ctx, store, img, tree, tmpImg, opts); err != nil {
		return "", err
	}
	if err := os.Chmod(tmpImg, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmpImg, final); err != nil {
		return "", err
	}
	// Bases of this image made by an older recipe (running boxes keep
	// theirs open; stopped ones use this one when they start).
	removeBases(dir, hexd, final)
	if opts.Note != nil {
		fi, _ := os.Stat(final)
		var sz int64
		if fi != nil {
			sz = fi.Size()
		}
		opts.Note(fmt.Sprintf("built rootfs base %s for %s (%d MiB) in %s", final, img.Ref, sz>>20, time.Since(start).Round(time.Millisecond)))
	}
	return final, nil
}

// baseRecipe names how bases are made (mkfsBase, InitLayer): change it with
// them, so that bases cached by an older recipe are made again.
// Recipe 1 (named <digest hex>.erofs) had no init layer.
// Recipe 3 builds byte for byte the same base from the same image on any
// host (fixed UUID and build time: reproducibleMkfs), which a memory
// snapshot moved to another host needs.
const baseRecipe = "r3"

// baseName is the file name of the base of the image with digest hexd.
func baseName(hexd string) string { return hexd + "-" + baseRecipe + ".erofs" }

// BasePath returns where Base keeps the base of the image with manifest
// digest ("sha256:...") in cacheDir (not "").
func BasePath(cacheDir, digest string) string {
	return filepath.Join(cacheDir, "rootfs", baseName(strings.TrimPrefix(digest, "sha256:")))
}

// removeBases removes the bases of digest hexd in dir, of any recipe,
// except keep.
func removeBases(dir, hexd, keep string) error {
	old, _ := filepath.Glob(filepath.Join(dir, hexd+"*.erofs"))
	for _, p := range old {
		if p == keep {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// InitLayer gives the unpacked root filesystem at root what Docker's init
// layer gives a container's: empty regular files /etc/hosts, /etc/hostname
// and /etc/resolv.conf where the image has none (missing, or a symlink such
// as systemd-resolved's resolv.conf), so that the guest agent can bind-mount
// the box's own over them. Writing them into the box instead would copy
// /etc up into the writable layer at every boot: under TCG the first write
// through overlayfs and ext4 costs ~35 ms.
//
// The files, and /etc when it is made, get /etc's mtime (the epoch when
// there was none), which /etc keeps: the same image gives the same base.
func InitLayer(root string) error {
	etc := filepath.Join(root, "etc")
	mtime := time.Unix(0, 0)
	if fi, err := os.Lstat(etc); err == nil && !fi.IsDir() {
		return nil // an image whose /etc is not a directory keeps it
	} else if err == nil {
		mtime = fi.ModTime()
	} else if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	defer os.Chtimes(etc, mtime, mtime)
	for _, name := range guestabi.EtcFiles {
		p := filepath.Join(etc, name)
		fi, err := os.Lstat(p)
		if err == nil && (fi.Mode().IsRegular() || fi.IsDir()) {
			continue
		}
		if err == nil {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			return err
		}
	}
	return nil
}

// erofs superblock: at byte 1024, magic first, log2 of the block size at
// 0x0C, the block count at 0x24 (fs/erofs/erofs_fs.h in Linux).
const (
	sbOffset   = 1024
	erofsMagic = 0xE0F5E1E2
)

// validBase reports whether p is an erofs image whose size matches the
// block count in its superblock (so not empty or cut short).
func validBase(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	var sb [0x28]byte
	if _, err := f.ReadAt(sb[:], sbOffset); err != nil {
		return false
	}
	le := binary.LittleEndian
	if le.Uint32(sb[0:]) != erofsMagic || sb[0xC] < 9 || sb[0xC] > 16 {
		return false
	}
	return int64(le.Uint32(sb[0x24:]))<<sb[0xC] == fi.Size()
}

// mkfsBase unpacks img into tree/root and runs mkfs.erofs to make out.
func mkfsBase(ctx context.Context, store *image.Store, img *image.Image, tree, out string, opts BaseOptions) error {
	mkfs, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return fmt.Errorf("mkfs.erofs not found: install erofs-utils (apt-get install erofs-utils) to build root filesystems")
	}
	root := filepath.Join(tree, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	if err := unpack.Image(ctx, store, img, root, unpack.Options{Note: opts.Note, Limits: opts.Limits}); err != nil {
		return fmt.Errorf("unpack %s: %w", img.Ref, err)
	}
	// The unpack left every directory with the times of the layers (the
	// epoch where none set them: unpack.Image), the same on every host;
	// InitLayer keeps /etc's, and the root's is put back after it.
	rootInfo, err := os.Stat(root)
	if err != nil {
		return err
	}
	if err := InitLayer(root); err != nil {
		return fmt.Errorf("init layer for %s: %w", img.Ref, err)
	}
	if err := os.Chtimes(root, rootInfo.ModTime(), rootInfo.ModTime()); err != nil {
		return err
	}
	args := []string{"--quiet", "-U" + UUIDFor(img.Digest)}
	if os.Geteuid() != 0 {
		// Without root the tree's owners are wrong anyway; make them root.
		args = append(args, "--all-root")
	}
	args = append(args, out, root)
	cmd := exec.CommandContext(ctx, mkfs, args...)
	cmd.Env = ReproducibleEnv()
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mkfs.erofs for %s: %w: %s", img.Ref, err, strings.TrimSpace(b.String()))
	}
	return nil
}

// RemoveBase deletes the cached base of the image with manifest digest
// ("sha256:...") from cacheDir , after any build
// of it in progress. It is not an error if there is none. Running boxes keep
// the copy they have open.
func RemoveBase(ctx context.Context, cacheDir, digest string) error {
	if cacheDir == "" {
		return errors.New("rootfs: no cache directory given")
	}
	hexd, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hexd) != 64 || strings.ContainsAny(hexd, "/.") {
		return fmt.Errorf("unexpected digest %q", digest)
	}
	dir := filepath.Join(cacheDir, "rootfs")
	if m, _ := filepath.Glob(filepath.Join(dir, hexd+"*.erofs")); len(m) == 0 {
		return nil
	}
	l := flock.New(filepath.Join(dir, hexd+".lock"))
	if _, err := l.TryLockContext(ctx, 100*time.Millisecond); err != nil {
		return fmt.Errorf("lock rootfs base %s: %w", hexd, err)
	}
	defer l.Unlock()
	return removeBases(dir, hexd, "")
}

// NewDisk creates path as a sparse ext4 filesystem image of sizeMiB MiB,
// labelled "airlock-rw" with a root-owned root directory, for use as a box's
// writable layer. It refuses to overwrite an existing file, and removes its
// partial file on failure.
//
// With cacheDir set, the empty filesystem is made once per size, as
// CACHE/rootfs/rw-<sizeMiB>m-<rwTemplateVersion>.ext4 (~2 MiB of metadata
// for 4 GiB, kept), and each disk is a sparse copy of it: a few ms instead
// of mkfs.ext4's ~20-70 ms. The disks then share the filesystem UUID, which
// nothing in a box relies on. Without it, mkfs.ext4 (e2fsprogs) runs for
// each disk.
func NewDisk(path string, sizeMiB int, cacheDir string) error {
	if sizeMiB < 8 {
		return fmt.Errorf("disk size %d MiB is too small (minimum 8 MiB)", sizeMiB)
	}
	if cacheDir == "" {
		return mkfsDisk(path, sizeMiB)
	}
	dir := filepath.Join(cacheDir, "rootfs")
	tmpl := filepath.Join(dir, fmt.Sprintf("rw-%dm-%s.ext4", sizeMiB, rwTemplateVersion))
	if _, err := os.Stat(tmpl); err != nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// Partial templates of processes killed while making one.
		stale, _ := filepath.Glob(filepath.Join(dir, "rw-*.ext4.tmp-*"))
		for _, p := range stale {
			if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) > 10*time.Minute {
				os.Remove(p)
			}
		}
		tmp := fmt.Sprintf("%s.tmp-%d", tmpl, os.Getpid())
		os.Remove(tmp)
		if err := mkfsDisk(tmp, sizeMiB); err != nil {
			return err
		}
		if err := os.Rename(tmp, tmpl); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	return sparse.Copy(tmpl, path)
}

// rwTemplateVersion names the recipe of mkfsDisk in cached templates: change
// it with mkfsDisk's options so that old templates are not used.
const rwTemplateVersion = "v1"

// mkfsDisk makes path an empty ext4 filesystem of sizeMiB MiB.
func mkfsDisk(path string, sizeMiB int) error {
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return fmt.Errorf("mkfs.ext4 not found: install e2fsprogs")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			os.Remove(path)
		}
	}()
	if err := f.Truncate(int64(sizeMiB) << 20); err != nil {
		f.Close()
		return fmt.Errorf("create disk: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	// The file is sparse, so it reads as zeros: mkfs need not write the
	// inode tables and journal (64 MiB for 4 GiB), and the guest kernel
	// need not zero the inode tables in the background (ext4lazyinit).
	// e2fsprogs before 1.47 lacks the option: plain mkfs then.
	var out bytes.Buffer
	for _, ext := range []string{"root_owner=0:0,assume_storage_prezeroed=1", "root_owner=0:0"} {
		out.Reset()
		cmd := exec.Command(mkfs, "-q", "-F", "-E", ext, "-L", "airlock-rw", path)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err = cmd.Run(); err == nil {
			ok = true
			return nil
		}
	}
	return fmt.Errorf("mkfs.ext4 %s (%s MiB): %w: %s", path, strconv.Itoa(sizeMiB), err, strings.TrimSpace(out.String()))
}

// ReproducibleEpoch is the build time mkfs.erofs writes into a base's
// superblock (2100-01-01 UTC, as SOURCE_DATE_EPOCH): fixed, so that the
// same tree makes the same image, and later than any file's mtime, because
// erofs-utils clamps mtimes after it (files keep their own mtimes).
const ReproducibleEpoch = 4102444800

// ReproducibleEnv is the environment for mkfs.erofs runs that must give the
// same image for the same tree on any host: this process's, with
// SOURCE_DATE_EPOCH set to ReproducibleEpoch.
func ReproducibleEnv() []string {
	return append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.Itoa(ReproducibleEpoch))
}

// UUIDFor returns a filesystem UUID derived from s (for mkfs.erofs -U): the
// same on every host, unlike mkfs.erofs's random default.
func UUIDFor(s string) string {
	h := sha256.Sum256([]byte("airlock erofs uuid\x00" + s))
	h[6] = h[6]&0x0f | 0x50 // version 5 style (name based)
	h[8] = h[8]&0x3f | 0x80
	x := hex.EncodeToString(h[:16])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}
