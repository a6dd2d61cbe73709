package assets

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// AgentDiskDirs are the directories of the agent disk besides /init: the
// mount points the agent uses while the disk is the root filesystem.
var AgentDiskDirs = []string{"dev", "proc", "sys", "mnt", "mnt/base", "mnt/rw", "mnt/etc", "newroot"}

// AgentDisk returns a read-only erofs image holding the agent as /init and
// the mount points it needs, for kernels with every driver built in (the
// airlock kernel): the kernel mounts it as the root filesystem
// (root=/dev/vda rootfstype=erofs), so no initramfs is unpacked at boot and
// the agent's pages are read on demand instead of being copied into guest
// memory up front. It is built once per agent content with mkfs.erofs and
// cached under cacheDir/initrd.
func AgentDisk(ctx context.Context, cacheDir, agentPath string) (string, error) {
	f, err := os.Open(agentPath)
	if err != nil {
		return "", fmt.Errorf("read agent: %w", err)
	}
	defer f.Close()
	dir := filepath.Join(cacheDir, "initrd")
	digest, err := fileDigest(dir, f)
	if err != nil {
		return "", fmt.Errorf("read agent: %w", err)
	}
	h := sha256.New()
	// "r2": built reproducibly (fixed UUID below, -T0 fixes the times), so
	// the same agent gives the same disk on any host.
	h.Write([]byte("r2\x00" + strings.Join(AgentDiskDirs, ",")))
	h.Write([]byte(digest))
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	out := filepath.Join(dir, "agent-"+sum+".erofs")
	if _, err := os.Stat(out); err == nil {
		touch(out)
		return out, nil
	}
	mkfs, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return "", fmt.Errorf("mkfs.erofs not found: install erofs-utils (apt-get install erofs-utils)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tree, err := os.MkdirTemp(dir, ".agent-tree-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tree)
	for _, d := range AgentDiskDirs {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return "", err
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	init, err := os.OpenFile(filepath.Join(tree, "init"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(init, f)
	if cerr := init.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	tf, err := os.CreateTemp(dir, ".agent-"+sum+"-*.erofs")
	if err != nil {
		return "", err
	}
	tf.Close()
	tmp := tf.Name()
	// A UUID of the disk's name (not mkfs.erofs's random one) and -T0:
	// the same agent makes the same disk on every host, which a memory
	// snapshot restored on another host needs.
	u := sha256.Sum256([]byte("airlock agent disk uuid\x00" + sum))
	x := hex.EncodeToString(u[:16])
	uuid := x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
	cmd := exec.CommandContext(ctx, mkfs, "--quiet", "--all-root", "-T0", "-U"+uuid, tmp, tree)
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("mkfs.erofs for the agent disk: %w: %s", err, strings.TrimSpace(b.String()))
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return "", err
	}
	prune(dir, "agent-*.erofs", out)
	prune(dir, ".digest-*", "")
	return out, nil
}

// PathDigest returns the hex SHA-256 of the file at path, memoized in
// dir as fileDigest does (the file is hashed again once its device, inode,
// size or modification time change).
func PathDigest(dir, path string) (string, error) { return pathDigest(dir, path) }

// pathDigest is fileDigest of the file at path.
func pathDigest(dir, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return fileDigest(dir, f)
}

// fileDigest returns the hex SHA-256 of f's content. The digest is kept in
// dir under a name derived from f's path, keyed by f's device, inode, size
// and modification time, so that a CLI command that boots a box does not
// hash the 8 MB agent again (~20 ms) unless the file changed.
func fileDigest(dir string, f *os.File) (string, error) {
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	key := fmt.Sprintf("%d %d", fi.Size(), fi.ModTime().UnixNano())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		key += fmt.Sprintf(" %d %d", st.Dev, st.Ino)
	}
	if dir == "" {
		h := sha256.New()
		_, err := io.Copy(h, f)
		return hex.EncodeToString(h.Sum(nil)), err
	}
	abs, _ := filepath.Abs(f.Name())
	name := sha256.Sum256([]byte(abs))
	memo := filepath.Join(dir, ".digest-"+hex.EncodeToString(name[:8]))
	if b, err := os.ReadFile(memo); err == nil {
		if k, d, ok := strings.Cut(strings.TrimSpace(string(b)), "\n"); ok && k == key && len(d) == 64 {
			return d, nil
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	d := hex.EncodeToString(h.Sum(nil))
	// File times are coarse (a clock tick): a file written in the last
	// seconds could change again without a new time, so it is not memoized.
	if time.Since(fi.ModTime()) > 2*time.Second && os.MkdirAll(dir, 0o755) == nil {
		if tmp, err := os.CreateTemp(dir, ".digest-*"); err == nil {
			tmp.WriteString(key + "\n" + d + "\n")
			tmp.Close()
			if os.Rename(tmp.Name(), memo) != nil {
				os.Remove(tmp.Name())
			}
		}
	}
	return d, nil
}

// maxUnused is how long an agent disk or initramfs nobody used is kept.
const maxUnused = 7 * 24 * time.Hour

// touch marks a cached file as used now (its modification time).
func touch(path string) {
	now := time.Now()
	os.Chtimes(path, now, now)
}

// prune removes the files in dir matching pattern, other than keep, that
// were not used for maxUnused: each agent build makes a new agent disk and
// initramfs, and the old ones would pile up. A running VM keeps the disk it
// opened. A pruned digest memo only costs one hash again.
func prune(dir, pattern, keep string) {
	old, _ := filepath.Glob(filepath.Join(dir, pattern))
	for _, p := range old {
		if fi, err := os.Stat(p); err == nil && p != keep && time.Since(fi.ModTime()) > maxUnused {
			os.Remove(p)
		}
	}
}

// CheckAgent returns an error when the file at path cannot be the guest
// agent: not an x86-64 ELF executable, or dynamically linked (the guest has
// no dynamic loader for it; the kernel would panic with "No working init
// found").
func CheckAgent(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("guest agent %s: %w", path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("guest agent %s is built for %s, not x86-64", path, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("guest agent %s is dynamically linked; the guest needs a static one: run hack/setup.sh, or in the airlock source tree: CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/airlock-agent ./cmd/airlock-agent", path)
		}
	}
	return nil
}
