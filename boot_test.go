package airlock_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// thpEnabled reads THP_enabled from /proc/PID/status ("" if absent).
func thpEnabled(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "THP_enabled:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestTHPModes(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	// want: QEMU's THP_enabled; memfd: whether guest RAM is a memfd.
	check := func(t *testing.T, env, want string, memfd bool) {
		t.Setenv("AIRLOCK_THP", env)
		r := openRuntime(t, "")
		info, err := r.BootInfo()
		if err != nil {
			t.Fatal(err)
		}
		if env == "" {
			if info.Accel != "tcg" || info.KernelKind != "airlock" {
				t.Skipf("default is only off for the airlock kernel under TCG (have %s, %s)", info.KernelKind, info.Accel)
			}
		}
		self := thpEnabled(t, os.Getpid())
		b, err := r.Create(ctx, airlock.BoxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Remove(ctx, true)
		if now := thpEnabled(t, os.Getpid()); now != self {
			t.Errorf("starting the box changed this process's THP setting from %s to %s", self, now)
		}
		bi, err := b.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := thpEnabled(t, bi.PID)
		if got == "" {
			t.Skip("this kernel does not report THP_enabled")
		}
		wantMode := map[string]string{"": "off"}[env]
		if wantMode == "" {
			wantMode = env
		}
		if got != want || info.THP != wantMode {
			t.Fatalf("AIRLOCK_THP=%q: QEMU THP_enabled %s, BootInfo.THP %q; want %s, %q", env, got, info.THP, want, wantMode)
		}
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", bi.PID))
		if err != nil {
			t.Fatal(err)
		}
		if has := strings.Contains(string(maps), "/memfd:"); has != memfd {
			t.Errorf("AIRLOCK_THP=%q: guest RAM in a memfd: %v, want %v", env, has, memfd)
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", bi.PID))
		if err != nil {
			t.Fatal(err)
		}
		if has := strings.Contains(string(environ), "glibc.malloc.hugetlb=1"); has != (want == "1") {
			t.Errorf("AIRLOCK_THP=%q: QEMU's malloc asks for huge pages: %v, want %v", env, has, want == "1")
		}
		if res := exec(t, b, airlock.ExecOptions{}, "true"); res.ExitCode != 0 {
			t.Fatalf("box does not run: %+v", res)
		}
	}
	t.Run("default", func(t *testing.T) { check(t, "", "0", true) })
	t.Run("on", func(t *testing.T) { check(t, "on", "1", false) })
	t.Run("code", func(t *testing.T) { check(t, "code", "1", true) })
	t.Run("off", func(t *testing.T) { check(t, "off", "0", true) })
	t.Run("bad", func(t *testing.T) {
		t.Setenv("AIRLOCK_THP", "maybe")
		r := openRuntime(t, "")
		if _, err := r.BootInfo(); err == nil || !strings.Contains(err.Error(), "AIRLOCK_THP") {
			t.Fatalf("AIRLOCK_THP=maybe: %v", err)
		}
	})
}

// TestDebianKernelBootsFromInitramfs boots a box on Debian's cloud kernel,
// the fallback when the airlock kernel is not built: it gets the agent and
// its modules from an initramfs instead of the agent disk.
func TestDebianKernelBootsFromInitramfs(t *testing.T) {
	vmtest.Require(t)
	deb, err := filepath.EvalSymlinks(filepath.Join(defaults.Cache(), "kernel", "debian", "vmlinux"))
	if err != nil {
		if os.Getenv("AIRLOCK_REQUIRE_VM") == "1" {
			t.Fatalf("Debian's kernel is not in the cache (hack/fetch-debian-kernel.sh): %v", err)
		}
		t.Skipf("Debian's kernel is not in the cache: %v", err)
	}
	r, info := openBoot(t, airlock.Options{Kernel: deb})
	if info.KernelKind != "debian" || info.Initrd == "" || info.AgentDisk != "" {
		t.Fatalf("boot info: %+v", info)
	}
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(ctx, true)
	res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", "uname -r; grep -c -E '^(virtio_blk|erofs|overlay) ' /proc/modules; echo hi > /tmp/f; cat /tmp/f")
	out := string(res.Stdout)
	if res.ExitCode != 0 || !strings.Contains(out, "cloud-amd64") || !strings.Contains(out, "\n3\n") || !strings.HasSuffix(out, "hi\n") {
		t.Fatalf("exit %d stdout %q stderr %q", res.ExitCode, out, res.Stderr)
	}
}

// TestAgentDiskRemovedUnderRuntimeIsRebuilt: another process may prune the
// cached agent disk while a runtime that already resolved it lives on.
func TestAgentDiskRemovedUnderRuntimeIsRebuilt(t *testing.T) {
	vmtest.Require(t)
	cache := t.TempDir()
	// A private cache holding links to the shared kernels, so the agent
	// disk built here can be removed without disturbing other tests.
	shared := defaults.Cache()
	for _, d := range []string{"kernel", "rootfs"} {
		if err := os.Symlink(filepath.Join(shared, d), filepath.Join(cache, d)); err != nil {
			t.Fatal(err)
		}
	}
	r, info := openBoot(t, airlock.Options{CacheDir: cache})
	if info.AgentDisk == "" {
		t.Skipf("kernel %s boots from an initramfs", info.KernelKind)
	}
	if err := os.Remove(info.AgentDisk); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{})
	if err != nil {
		t.Fatalf("create after the agent disk was removed: %v", err)
	}
	defer b.Remove(ctx, true)
	if res := exec(t, b, airlock.ExecOptions{}, "true"); res.ExitCode != 0 {
		t.Fatalf("exec: %+v", res)
	}
}

// openBoot opens a runtime with o on a fresh home and the shared images,
// closed when the test ends, and resolves what its boxes boot with.
func openBoot(t *testing.T, o airlock.Options) (*airlock.Runtime, airlock.BootInfo) {
	t.Helper()
	o.Home, o.ImagesDir, o.Warn = t.TempDir(), vmtest.ImagesDir(), func(string) {}
	r, err := airlock.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	info, err := r.BootInfo()
	if err != nil {
		t.Fatal(err)
	}
	return r, info
}

// TestGuestClocks checks what makes timers precise in a box, with one vCPU
// and with two: the TSC clocksource (not jiffies) and high-resolution
// timers on every vCPU. Under TCG a one-vCPU box of the airlock kernel boots
// without ACPI and uses the PIT for clock events (no APIC timer
// calibration); a two-vCPU box keeps its local APIC timers.
func TestGuestClocks(t *testing.T) {
	vmtest.Require(t)
	r, info := openBoot(t, airlock.Options{})
	ctx := context.Background()
	for _, cpus := range []int{1, 2} {
		t.Run(strconv.Itoa(cpus)+"cpu", func(t *testing.T) {
			b, err := r.Create(ctx, airlock.BoxOptions{CPUs: cpus})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Remove(ctx, true)
			// The kernel moves from tsc-early to tsc about a second after boot.
			res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", `
cs=/sys/devices/system/clocksource/clocksource0/current_clocksource
for i in $(seq 100); do [ "$(cat $cs)" = tsc ] && break; sleep 0.1; done
echo "clocksource $(cat $cs)"
echo "hres $(grep -c 'hres_active *: 1' /proc/timer_list)"
echo "clockevent $(cat /sys/devices/system/clockevents/clockevent0/current_device)"
echo "acpi $(test -d /sys/firmware/acpi && echo yes || echo no)"`)
			out := string(res.Stdout)
			t.Logf("%d vCPU: %s", cpus, strings.ReplaceAll(out, "\n", "; "))
			want := []string{"clocksource tsc\n", "hres " + strconv.Itoa(cpus) + "\n"}
			if info.Accel == "tcg" && info.KernelKind == "airlock" {
				if cpus == 1 {
					want = append(want, "clockevent pit\n", "acpi no\n")
				} else {
					want = append(want, "clockevent lapic\n", "acpi yes\n")
				}
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("%d vCPU: want %q in:\n%s%s", cpus, w, out, res.Stderr)
				}
			}
		})
	}
}

// TestMoreVCPUsThanHostCPUsWarns: under TCG each vCPU is a host thread; a
// box with more vCPUs than the host has CPUs is slower, and says so.
func TestMoreVCPUsThanHostCPUsWarns(t *testing.T) {
	vmtest.Require(t)
	var mu sync.Mutex
	var warnings []string
	r, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(m string) {
		mu.Lock()
		warnings = append(warnings, m)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	info, err := r.BootInfo()
	if err != nil {
		t.Fatal(err)
	}
	if info.Accel != "tcg" {
		t.Skip("the warning is for TCG")
	}
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{CPUs: runtime.NumCPU() + 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(ctx, true)
	mu.Lock()
	defer mu.Unlock()
	if w := strings.Join(warnings, "\n"); !strings.Contains(w, strconv.Itoa(runtime.NumCPU()+1)+" vCPUs but this host has") {
		t.Fatalf("no vCPU warning in %q", w)
	}
}
