package assets

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestInitrdIsAValidCpioWithAgentAndModules(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio not installed: cannot list the archive")
	}
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	os.WriteFile(agent, []byte("#!agent binary"), 0o755)
	mods := filepath.Join(dir, "modules")
	os.MkdirAll(mods, 0o755)
	os.WriteFile(filepath.Join(mods, "a.ko"), []byte("module a"), 0o644)
	os.WriteFile(filepath.Join(mods, "modules.load"), []byte("a.ko\n"), 0o644)
	cache := filepath.Join(dir, "cache")
	p, err := Initrd(cache, agent, Kernel{ModulesDir: mods})
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", "-c", "cpio -itv < "+p).CombinedOutput()
	if err != nil {
		t.Fatalf("cpio cannot read the initramfs: %v\n%s", err, out)
	}
	for _, want := range []string{"init", "dev/console", "lib/modules/airlock/a.ko", "lib/modules/airlock/modules.load"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("initramfs lacks %s:\n%s", want, out)
		}
	}
	// Cached: same content, same file.
	p2, err := Initrd(cache, agent, Kernel{ModulesDir: mods})
	if err != nil || p2 != p {
		t.Fatalf("second build: %s %v (first %s)", p2, err, p)
	}
	// A new agent makes a new initramfs; the old one is kept until it has
	// not been used for a week.
	os.WriteFile(agent, []byte("#!agent binary v2"), 0o755)
	p3, _ := Initrd(cache, agent, Kernel{ModulesDir: mods})
	if p3 == p {
		t.Fatal("initramfs not rebuilt for a new agent")
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("recent initramfs %s removed: %v", p, err)
	}
	week := time.Now().Add(-8 * 24 * time.Hour)
	os.Chtimes(p, week, week)
	os.WriteFile(agent, []byte("#!agent binary v3"), 0o755)
	if _, err := Initrd(cache, agent, Kernel{ModulesDir: mods}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("initramfs unused for a week %s still there: %v", p, err)
	}
	if _, err := os.Stat(p3); err != nil {
		t.Errorf("recent initramfs %s removed: %v", p3, err)
	}
}

func TestFindKernelPrefersEnvThenBuiltThenDebian(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("AIRLOCK_CACHE", cache)
	t.Setenv("AIRLOCK_KERNEL", "")
	if _, _, err := FindKernel(""); err != ErrNoKernel {
		t.Fatalf("empty cache: %v", err)
	}
	deb := filepath.Join(cache, "kernel", "debian-6.1")
	os.MkdirAll(filepath.Join(deb, "modules"), 0o755)
	os.WriteFile(filepath.Join(deb, "vmlinux"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(deb, "modules", "modules.load"), nil, 0o644)
	os.WriteFile(filepath.Join(deb, "info"), []byte("version=6.1.0-57-cloud-amd64\n"), 0o644)
	os.Symlink("debian-6.1", filepath.Join(cache, "kernel", "debian"))
	k, note, err := FindKernel("")
	if err != nil || k.Kind != KernelDebian || note == "" || k.ModulesDir == "" || k.Version != "6.1.0-57-cloud-amd64" {
		t.Fatalf("debian fallback: %+v %q %v", k, note, err)
	}
	built := filepath.Join(cache, "kernel", "vmlinux-airlock-6.1-abc")
	os.WriteFile(built, []byte("y"), 0o644)
	os.WriteFile(built+".info", []byte("version=6.1.192-3\nconfig_sha256=abcdef\n"), 0o644)
	os.Symlink("vmlinux-airlock-6.1-abc", filepath.Join(cache, "kernel", "vmlinux-airlock"))
	k, note, err = FindKernel("")
	if err != nil || k.Kind != KernelAirlock || note != "" || k.ConfigHash != "abcdef" || k.ModulesDir != "" {
		t.Fatalf("built kernel: %+v %q %v", k, note, err)
	}
	// A cache directory given by the caller wins over $AIRLOCK_CACHE.
	t.Setenv("AIRLOCK_CACHE", t.TempDir())
	if k, _, err = FindKernel(cache); err != nil || k.Kind != KernelAirlock {
		t.Fatalf("explicit cache dir: %+v %v", k, err)
	}
	t.Setenv("AIRLOCK_KERNEL", filepath.Join(deb, "vmlinux"))
	k, _, err = FindKernel("")
	if err != nil || k.Path != filepath.Join(deb, "vmlinux") || k.ModulesDir == "" {
		t.Fatalf("AIRLOCK_KERNEL: %+v %v", k, err)
	}
}

func TestKernelBootsWithoutACPIFromItsConfig(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "vmlinux")
	os.WriteFile(k, []byte("kernel"), 0o644)
	if KernelAt(k).BootsWithoutACPI {
		t.Error("a kernel without a .config beside it must boot with ACPI")
	}
	for _, c := range []struct {
		config string
		want   bool
	}{
		{"CONFIG_X86_MPPARSE=y\nCONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y\n", true},
		{"CONFIG_X86_MPPARSE=y\n# CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES is not set\n", false},
		{"CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y\n", false},
	} {
		os.WriteFile(k+".config", []byte(c.config), 0o644)
		if got := KernelAt(k).BootsWithoutACPI; got != c.want {
			t.Errorf("config %q: BootsWithoutACPI %v, want %v", c.config, got, c.want)
		}
	}
	if KernelAt(k).IPConfig {
		t.Error("IPConfig without CONFIG_IP_PNP")
	}
	os.WriteFile(k+".config", []byte("CONFIG_IP_PNP=y\n# CONFIG_IP_PNP_DHCP is not set\n"), 0o644)
	if !KernelAt(k).IPConfig {
		t.Error("CONFIG_IP_PNP=y but no IPConfig")
	}
}
