package qemu

import (
	"fmt"
	"os"
	"strings"
	"testing"
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
}

func TestKernelCmdlineTCGHintOnlyUnderTCG(t *testing.T) {
	for _, hint := range []string{"tsc_early_khz=", "tsc=reliable", "norandmaps"} {
		if !strings.Contains(KernelCmdline(AccelTCG), hint) {
			t.Errorf("TCG command line lacks %s", hint)
		}
		if strings.Contains(KernelCmdline(AccelKVM), hint) {
			t.Errorf("KVM command line has the TCG-only %s", hint)
		}
	}
	if !strings.Contains(KernelCmdline(AccelKVM, "airlock.rw=/dev/vdb"), " airlock.rw=/dev/vdb") {
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
	if c := TSCkHz(); c < k*98/100 || c > k*102/100 {
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
