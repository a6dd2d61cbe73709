package qemu

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/vmm"
)

// TestCheckCmdlineTakesWhatTheDriverWrites: every command line the driver
// builds (KVM and TCG, debug or quiet, agent disk or initramfs, network,
// vsock, volumes over 9p and virtio-fs, the bench's bare init) passes
// CheckCmdline, so a snapshot airlock took always restores.
func TestCheckCmdlineTakesWhatTheDriverWrites(t *testing.T) {
	spec := vmm.Spec{ID: "0123456789ab", Dir: t.TempDir(), CPUs: 1, MemoryMiB: 256, Hostname: "my-box.example",
		Net: &vmm.NetSpec{Socket: "/b/net.sock", MTU: 65520}, ExtraCmdline: []string{guestabi.BareParam},
		Volumes: []vmm.Volume{{HostDir: "/src", Target: "/src dir/with spaces", ReadOnly: true}, {Disk: "/v.ext4", Target: "/data"}}}
	for _, accel := range []string{AccelTCG, AccelKVM} {
		for _, o := range []Options{{}, {Debug: true, VolumeTransport: TransportVirtioFS}} {
			for _, agentDisk := range []string{"", "/agent.erofs"} {
				boot := &bootAssets{accel: AccelChoice{Accel: accel}, agentDisk: agentDisk}
				boot.kernel.IPConfig = true
				for _, cid := range []uint32{0, 1234} {
					c := New(o).config(spec, boot, "/base", cid)
					if err := CheckCmdline(c.Cmdline); err != nil {
						t.Errorf("%s %+v agent disk %q: %v\n%s", accel, o, agentDisk, err, c.Cmdline)
					}
				}
			}
		}
	}
}

// TestHostileArchiveKernelCmdline: a memory archive's (or an altered
// snapshot's) machine.json carries the kernel command line the restore
// hands to QEMU's -append. Anything airlock does not write is refused,
// with an error that names it, both where machine.json is checked on
// import (CheckMachineFile) and where a restore reads it (CheckSnapshot).
func TestHostileArchiveKernelCmdline(t *testing.T) {
	good := New(Options{}).config(vmm.Spec{ID: "0123456789ab", Dir: t.TempDir(), CPUs: 1, MemoryMiB: 256},
		&bootAssets{accel: AccelChoice{Accel: AccelTCG}, agentDisk: "/agent.erofs"}, "/base", 0).Cmdline
	for _, bad := range []string{
		"init=/bin/sh", "rdinit=/bin/sh", "init=/init2", "root=/dev/vdb", "rw", "--", "usbcore.authorized_default=1",
		"airlock.net=slirp", "airlock.hostname=a;b", "airlock.ports=99999", "airlock.vol=9p:x:00:rw",
		"airlock.root=/etc/shadow", "tsc_early_khz=x", "loglevel=8", "console=ttyS1", "systemd.unit=rescue.target",
	} {
		for _, cmdline := range []string{good + " " + bad, bad + " " + good} {
			err := CheckCmdline(cmdline)
			if err == nil || !strings.Contains(err.Error(), `"`+bad+`"`) {
				t.Errorf("CheckCmdline(... %s ...) = %v, want it refused naming %q", bad, err, bad)
			}
			mm, _ := json.Marshal(machineMeta{Config: Config{Cmdline: cmdline}})
			if err := New(Options{}).CheckMachineFile(mm); err == nil || !strings.Contains(err.Error(), bad) {
				t.Errorf("CheckMachineFile with %s: %v", bad, err)
			}
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, snapMachine), mm, 0o600)
			if err := New(Options{}).CheckSnapshot(vmm.Spec{ID: "0123456789ab", Dir: t.TempDir()}, dir); err == nil || !strings.Contains(err.Error(), bad) {
				t.Errorf("CheckSnapshot with %s: %v", bad, err)
			}
		}
	}
	for _, bad := range []string{good + ` airlock.hostname="a b"`, good + " airlock.hostname=a\x1b]0;x\x07", strings.Repeat("ro ", 2000)} {
		if err := CheckCmdline(bad); err == nil {
			t.Errorf("CheckCmdline(%q) passed", bad)
		}
	}
	if err := CheckCmdline(good); err != nil {
		t.Errorf("the driver's own command line: %v", err)
	}
}

// TestHostileArchiveTestFaultParam: the test-only exec wedge's kernel
// parameter is not part of a release build: its driver never writes it
// and a snapshot's or memory archive's command line that carries it is
// refused. (A build with -tags airlock_testfaults accepts it:
// TestWedgeExecCmdline.)
func TestHostileArchiveTestFaultParam(t *testing.T) {
	const wedge = "airlock.test_wedge_exec=1"
	good := New(Options{Debug: true}).config(vmm.Spec{ID: "0123456789ab", Dir: t.TempDir(), CPUs: 1, MemoryMiB: 256},
		&bootAssets{accel: AccelChoice{Accel: AccelTCG}, agentDisk: "/agent.erofs"}, "/base", 0).Cmdline
	if strings.Contains(good, "wedge") {
		t.Fatalf("the driver wrote the test fault unasked: %s", good)
	}
	err := CheckCmdline(good + " " + wedge)
	switch {
	case guestabi.TestFaults && err != nil:
		t.Errorf("test-fault build: CheckCmdline(... %s) = %v", wedge, err)
	case !guestabi.TestFaults && (err == nil || !strings.Contains(err.Error(), wedge)):
		t.Errorf("release build: CheckCmdline(... %s) = %v, want it refused naming it", wedge, err)
	}
}

// TestShareHostModes: a 9p share's -fsdev carries the host modes of the
// umask (fmode, dmode), so what a box writes is not 0600 on the host.
func TestShareHostModes(t *testing.T) {
	spec := vmm.Spec{ID: "0123456789ab", Dir: t.TempDir(), Volumes: []vmm.Volume{{HostDir: "/src", Target: "/src"}}}
	_, shares, _, _ := volumeDevices(spec, Transport9p, 1)
	fm, dm := HostModes()
	if len(shares) != 1 || shares[0].FileMode != fm || shares[0].DirMode != dm || fm&0o600 != 0o600 || dm&0o700 != 0o700 {
		t.Fatalf("shares %+v, host modes %v %v", shares, fm, dm)
	}
	args := strings.Join(Config{Shares: []Share{{ID: "vol0", Tag: "t", HostDir: "/src", FileMode: 0o644, DirMode: 0o755}}}.Args(), " ")
	if !strings.Contains(args, "security_model=mapped-xattr,fmode=0644,dmode=0755") {
		t.Errorf("args: %s", args)
	}
}
