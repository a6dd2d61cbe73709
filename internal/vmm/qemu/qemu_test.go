package qemu

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/vmm"
)

func TestArgsDescribeTheBox(t *testing.T) {
	c := Config{
		Name: "airlock-abc", Accel: AccelTCG, CPUs: 2, MemoryMiB: 768,
		Kernel: "/k/vmlinux", Initrd: "/k/initrd", Cmdline: "console=ttyS0",
		Disks:        []Disk{{Path: "/img/base.erofs", ReadOnly: true}, {Path: "/box/rw,1.ext4"}},
		AgentSockets: []string{"/box/agent-0.sock", "/box/agent-1.sock"},
		QMPSocket:    "/box/qmp.sock", ConsoleLog: "/box/console.log", PIDFile: "/box/qemu.pid",
	}
	a := strings.Join(c.Args(), " ")
	for _, want := range []string{
		"-M microvm", "-accel tcg -cpu max", "-m 768", "-smp 2", "-no-reboot", "-nodefaults", "-daemonize",
		"-kernel /k/vmlinux", "-initrd /k/initrd",
		"file=/img/base.erofs,format=raw,if=none,readonly=on",
		"file=/box/rw,,1.ext4,format=raw,if=none,readonly=off", // commas escaped
		"virtio-serial-device,max_ports=3",
		"path=/box/agent-1.sock,server=on,wait=off", "name=airlock.agent.1",
		"-qmp unix:/box/qmp.sock,server=on,wait=off",
	} {
		if !strings.Contains(a, want) {
			t.Errorf("args lack %q:\n%s", want, a)
		}
	}
	if strings.Contains(a, "netdev") {
		t.Errorf("network disabled but args have a netdev: %s", a)
	}
	if strings.Contains(a, "vsock") {
		t.Errorf("no vsock CID but args have a vsock device: %s", a)
	}
	c.Network, c.Accel, c.VsockCID = true, AccelKVM, 77
	a = strings.Join(c.Args(), " ")
	if !strings.Contains(a, "-netdev user,id=net0") || !strings.Contains(a, "-accel kvm -cpu host") || !strings.Contains(a, "vhost-vsock-device,guest-cid=77") {
		t.Errorf("kvm+network args: %s", a)
	}
	if strings.Contains(a, "acpi=off") {
		t.Errorf("ACPI off without NoACPI: %s", a)
	}
	c.Disks[0].OptIOSize = 4 << 20
	if a = strings.Join(c.Args(), " "); !strings.Contains(a, "virtio-blk-device,drive=vda,opt_io_size=4194304 ") || strings.Contains(a, "drive=vdb,opt_io_size") {
		t.Errorf("OptIOSize args: %s", a)
	}
	c.NoACPI = true
	if a = strings.Join(c.Args(), " "); !strings.Contains(a, "-M microvm,acpi=off ") {
		t.Errorf("NoACPI args: %s", a)
	}
	c.NetSocket, c.NetMTU = "/box/net,1.sock", 65520
	a = strings.Join(c.Args(), " ")
	if !strings.Contains(a, "-netdev stream,id=net0,server=on,addr.type=unix,addr.path=/box/net,,1.sock -device virtio-net-device,netdev=net0,status=off,host_mtu=65520") || strings.Contains(a, "-netdev user") {
		t.Errorf("network helper args: %s", a)
	}
}

func TestKernelCmdlineTCGHintOnlyUnderTCG(t *testing.T) {
	for _, hint := range []string{"tsc_early_khz=", "tsc=reliable", "norandmaps"} {
		if !strings.Contains(KernelCmdline(AccelTCG, false, 0), hint) {
			t.Errorf("TCG command line lacks %s", hint)
		}
		if strings.Contains(KernelCmdline(AccelKVM, false, 0), hint) {
			t.Errorf("KVM command line has the TCG-only %s", hint)
		}
	}
	if !strings.Contains(KernelCmdline(AccelKVM, false, 0, "airlock.rw=/dev/vdb"), " airlock.rw=/dev/vdb") {
		t.Error("extra parameters missing")
	}
}

func TestProbeAccel(t *testing.T) {
	if _, err := ProbeAccel("bogus"); err == nil {
		t.Error("bogus accelerator accepted")
	}
	c, err := ProbeAccel("tcg")
	if err != nil || c.Accel != AccelTCG || !c.Forced {
		t.Errorf("tcg: %+v %v", c, err)
	}
	auto, err := ProbeAccel("")
	if err != nil {
		t.Fatal(err)
	}
	if p := kvmProblem(); p != "" {
		if auto.Accel != AccelTCG || auto.Reason != p {
			t.Errorf("KVM unusable (%s) but auto chose %+v", p, auto)
		}
		if _, err := ProbeAccel("kvm"); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("forcing kvm where it cannot work: %v", err)
		}
	} else if auto.Accel != AccelKVM {
		t.Errorf("KVM usable but auto chose %+v", auto)
	}
}

func TestTSCkHzIsPlausible(t *testing.T) {
	k := hostTSCkHz()
	if k < 500000 || k > 6000000 {
		t.Fatalf("host TSC rate %d kHz is implausible", k)
	}
	if c := TSCkHz(t.TempDir()); c < k*98/100 || c > k*102/100 {
		t.Errorf("cached rate %d kHz differs from a fresh measurement %d kHz", c, k)
	}
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "cpu MHz") && strings.Contains(string(b), "tsc_known_freq") {
			var mhz float64
			fmt.Sscanf(strings.SplitN(l, ":", 2)[1], "%f", &mhz)
			if d := float64(k)/1000 - mhz; d > mhz*0.05 || d < -mhz*0.05 {
				t.Errorf("measured %d kHz, cpuinfo says %.0f MHz", k, mhz)
			}
			break
		}
	}
}

func TestMallocHugePagesEnv(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{[]string{"A=1"}, []string{"A=1", "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"}},
		{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=2"}, []string{"GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}},
		{[]string{"GLIBC_TUNABLES=glibc.malloc.hugetlb=0"}, []string{"GLIBC_TUNABLES=glibc.malloc.hugetlb=0"}}, // the user's choice wins
	} {
		if got := mallocHugePagesEnv(c.in); strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("%q: got %q, want %q", c.in, got, c.want)
		}
	}
}

// TestGuestRAMArgs: under THPCode and THPNone guest RAM is one memfd
// (a snapshot's RAM image takes it; no huge pages for it), a restore maps
// its copy of the image or, for a stream-only snapshot, anonymous memory;
// under THPAll QEMU's own RAM.
func TestGuestRAMArgs(t *testing.T) {
	for _, thp := range []THPMode{THPCode, THPNone} {
		c := Config{Name: "b", Accel: AccelTCG, MemoryMiB: 512, THP: thp}
		a := strings.Join(c.Args(), " ")
		if want := "-object memory-backend-memfd,id=airlock-ram,size=512M -machine memory-backend=airlock-ram"; !strings.Contains(a, want) || strings.Contains(a, "-numa") {
			t.Errorf("%s: args lack %q (or have NUMA nodes):\n%s", thp, want, a)
		}
		c.Incoming = true
		if a := strings.Join(c.Args(), " "); !strings.Contains(a, "memory-backend-ram,id=airlock-ram,size=512M") {
			t.Errorf("%s: restore without a RAM image: not anonymous memory:\n%s", thp, a)
		}
		c.RAMImages, c.RAMCopy = []*os.File{os.Stdin}, true
		if a := strings.Join(c.Args(), " "); !strings.Contains(a, "memory-backend-file,mem-path=/proc/self/fd/3,share=on,id=airlock-ram,size=512M") {
			t.Errorf("%s: restore with its copy of the image:\n%s", thp, a)
		}
	}
	c := Config{Name: "b", Accel: AccelTCG, MemoryMiB: 512, THP: THPAll}
	if strings.Contains(strings.Join(c.Args(), " "), "memory-backend") {
		t.Errorf("THPAll args have memory backends: %v", c.Args())
	}
}

func TestReadaheadCoversTheDisk(t *testing.T) {
	for _, c := range []struct {
		size int64
		want int
	}{
		{1, 1 << 20},
		{2 << 20, 1 << 20},
		{7774208, 4 << 20}, // an agent disk: 7.4 MiB, readahead 8 MiB
		{9 << 20, 5 << 20},
	} {
		got := readaheadFor(c.size)
		if got != c.want || int64(2*got) < c.size {
			t.Errorf("readaheadFor(%d) = %d, want %d", c.size, got, c.want)
		}
	}
}

// TestSpecNetBecomesTheNIC: the driver turns vmm.Spec.Net into the NIC on
// the helper's socket (with its MTU) and the guest's network parameter; no
// Net, no NIC.
func TestSpecNetBecomesTheNIC(t *testing.T) {
	d := New(Options{})
	boot := &bootAssets{accel: AccelChoice{Accel: AccelTCG}}
	spec := vmm.Spec{ID: "0123456789ab", Dir: t.TempDir(), CPUs: 1, MemoryMiB: 128,
		Net: &vmm.NetSpec{Socket: "/b/net.sock", MTU: 65520}}
	c := d.config(spec, boot, "/base", 0)
	if !c.Network || c.NetSocket != "/b/net.sock" || c.NetMTU != 65520 || !strings.Contains(c.Cmdline, "airlock.net=") {
		t.Errorf("with Net: %+v", c)
	}
	spec.Net = nil
	c = d.config(spec, boot, "/base", 0)
	if c.Network || c.NetSocket != "" || strings.Contains(c.Cmdline, "airlock.net=") || strings.Contains(strings.Join(c.Args(), " "), "-netdev") {
		t.Errorf("without Net: %+v", c)
	}
}
