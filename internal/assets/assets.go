// Package assets finds and prepares what every box boots from: the guest
// kernel, the guest agent binary, and what carries the agent into the guest
// (an erofs agent disk for the airlock kernel, an initramfs for kernels
// that load modules). The kernel and agent come from the set-up script
// (hack/setup.sh) or from environment overrides; the agent disk and
// initramfs are built here on demand and cached.
package assets

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/airlock-run/airlock/internal/defaults"
)

// Kernel kinds.
const (
	KernelAirlock = "airlock" // built by hack/build-kernel.sh from the config in hack/kernel
	KernelDebian  = "debian"  // Debian's cloud kernel, with modules loaded from the initramfs
	KernelCustom  = "custom"  // AIRLOCK_KERNEL
)

// Kernel is a guest kernel.
type Kernel struct {
	Path       string // vmlinux (PVH ELF) or bzImage
	Kind       string // KernelAirlock, KernelDebian or KernelCustom
	Version    string // source/kernel version, when known
	ConfigHash string // sha256 of the config fragment and source patches it was built with (airlock kernels)
	// ModulesDir holds .ko files and modules.load to ship in the initramfs
	// ("" when everything is built in).
	ModulesDir string
	// BootsWithoutACPI is true when the kernel's config (the .config file
	// beside it) shows it can boot microvm without ACPI: it reads the MP
	// table (CONFIG_X86_MPPARSE) and takes its virtio-mmio devices from
	// the command line (CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES). The airlock
	// kernel can; Debian's cannot. See qemu.Config.NoACPI.
	BootsWithoutACPI bool
	// IPConfig is true when the kernel's config has CONFIG_IP_PNP: it can
	// configure the box's network itself from ip= on its command line.
	IPConfig bool
	// VirtioFS is true when the kernel's config has CONFIG_VIRTIO_FS: it
	// can mount host directories shared over virtio-fs.
	VirtioFS bool
}

// readConfig sets the fields that come from the kernel config at path (a
// .config file); a missing config leaves them false.
func (k *Kernel) readConfig(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	on := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if opt, ok := strings.CutSuffix(strings.TrimSpace(l), "=y"); ok {
			on[opt] = true
		}
	}
	k.BootsWithoutACPI = on["CONFIG_X86_MPPARSE"] && on["CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES"]
	k.IPConfig = on["CONFIG_IP_PNP"]
	k.VirtioFS = on["CONFIG_VIRTIO_FS"]
}

func readInfo(path string) map[string]string {
	m := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

// KernelAt describes the kernel at path: its .info sidecar (airlock
// kernels) or info file (Debian kernels) gives version and config hash, and a
// modules/ directory beside it with a modules.load file supplies modules to
// load from the initramfs.
func KernelAt(path string) Kernel {
	if p, err := filepath.EvalSymlinks(path); err == nil {
		path = p
	}
	k := Kernel{Path: path, Kind: KernelCustom}
	k.readConfig(path + ".config")
	if info := readInfo(path + ".info"); info["version"] != "" {
		k.Kind, k.Version, k.ConfigHash = KernelAirlock, info["version"], info["config_sha256"]
	}
	dir := filepath.Dir(path)
	if _, err := os.Stat(filepath.Join(dir, "modules", "modules.load")); err == nil {
		k.ModulesDir = filepath.Join(dir, "modules")
		k.Kind, k.Version = KernelDebian, readInfo(filepath.Join(dir, "info"))["version"]
	}
	return k
}

// ErrNoKernel is returned when no guest kernel is installed.
var ErrNoKernel = errors.New("no guest kernel found: run hack/setup.sh (it builds one into the airlock cache), or set AIRLOCK_KERNEL to a vmlinux")

// FindKernel returns the kernel boxes boot: $AIRLOCK_KERNEL if set; else
// the airlock kernel in cacheDir ("" means defaults.Cache()); else Debian's kernel
// there. note is a one-line remark for the user when falling back (empty
// otherwise).
func FindKernel(cacheDir string) (k Kernel, note string, err error) {
	if p := defaults.Kernel(); p != "" {
		if _, err := os.Stat(p); err != nil {
			return Kernel{}, "", fmt.Errorf("AIRLOCK_KERNEL=%s: %w", p, err)
		}
		return KernelAt(p), "", nil
	}
	if cacheDir == "" {
		cacheDir = defaults.Cache()
	}
	dir := filepath.Join(cacheDir, "kernel")
	if p, err := filepath.EvalSymlinks(filepath.Join(dir, "vmlinux-airlock")); err == nil {
		info := readInfo(p + ".info")
		k := Kernel{Path: p, Kind: KernelAirlock, Version: info["version"], ConfigHash: info["config_sha256"]}
		k.readConfig(p + ".config")
		return k, "", nil
	}
	if d, err := filepath.EvalSymlinks(filepath.Join(dir, "debian")); err == nil {
		if _, err := os.Stat(filepath.Join(d, "vmlinux")); err == nil {
			info := readInfo(filepath.Join(d, "info"))
			return Kernel{Path: filepath.Join(d, "vmlinux"), Kind: KernelDebian, Version: info["version"], ModulesDir: filepath.Join(d, "modules")},
				"using Debian's cloud kernel (slower boot, more memory); run hack/build-kernel.sh to build the airlock guest kernel", nil
		}
	}
	return Kernel{}, "", ErrNoKernel
}

// ErrNoAgent is returned when the guest agent binary cannot be found.
var ErrNoAgent = errors.New("guest agent binary airlock-agent not found: run hack/setup.sh, put airlock-agent next to the airlock binary, or set AIRLOCK_AGENT")

// FindAgent returns the path of the static guest agent binary:
// $AIRLOCK_AGENT, else airlock-agent beside the running executable, else
// airlock-agent on PATH.
func FindAgent() (string, error) {
	if p := defaults.Agent(); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("AIRLOCK_AGENT=%s: %w", p, err)
		}
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "airlock-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("airlock-agent"); err == nil {
		return p, nil
	}
	return "", ErrNoAgent
}

// Initrd returns an initramfs holding the agent as /init and, for kernels
// that need them, the modules listed in the kernel's modules.load. It is
// built once per (agent, modules) content and cached under cacheDir/initrd.
func Initrd(cacheDir, agentPath string, k Kernel) (string, error) {
	dir := filepath.Join(cacheDir, "initrd")
	// The name comes from the content's digests (memoized, see fileDigest):
	// a cached initramfs is found without reading the agent and modules.
	h := sha256.New()
	d, err := pathDigest(dir, agentPath)
	if err != nil {
		return "", fmt.Errorf("read agent: %w", err)
	}
	h.Write([]byte(d))
	var order []byte
	if k.ModulesDir != "" {
		order, err = os.ReadFile(filepath.Join(k.ModulesDir, "modules.load"))
		if err != nil {
			return "", fmt.Errorf("kernel modules list: %w", err)
		}
		h.Write(order)
		for _, name := range strings.Fields(string(order)) {
			d, err := pathDigest(dir, filepath.Join(k.ModulesDir, name))
			if err != nil {
				return "", fmt.Errorf("kernel module: %w", err)
			}
			h.Write([]byte(name))
			h.Write([]byte(d))
		}
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	out := filepath.Join(dir, "initrd-"+sum+".cpio")
	if _, err := os.Stat(out); err == nil {
		touch(out)
		return out, nil
	}
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return "", fmt.Errorf("read agent: %w", err)
	}
	type mod struct {
		name string
		data []byte
	}
	var mods []mod
	for _, name := range strings.Fields(string(order)) {
		b, err := os.ReadFile(filepath.Join(k.ModulesDir, name))
		if err != nil {
			return "", fmt.Errorf("kernel module: %w", err)
		}
		mods = append(mods, mod{name, b})
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	c := &cpioWriter{w: &buf}
	for _, d := range []string{"dev", "proc", "sys", "mnt", "newroot", "lib", "lib/modules", "lib/modules/airlock"} {
		c.Dir(d)
	}
	c.CharDev("dev/console", 0o600, 5, 1)
	c.File("init", 0o755, agent)
	for _, m := range mods {
		c.File("lib/modules/airlock/"+m.name, 0o644, m.data)
	}
	if order != nil {
		c.File("lib/modules/airlock/modules.load", 0o644, order)
	}
	if err := c.Close(); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".initrd-*")
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(tmp, &buf); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", err
	}
	tmp.Close()
	if err := os.Rename(tmp.Name(), out); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	prune(dir, "initrd-*.cpio", out)
	prune(dir, ".digest-*", "")
	return out, nil
}
