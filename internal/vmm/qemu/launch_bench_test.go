package qemu_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// BenchmarkLaunch measures Launch (start to QEMU's machine being built,
// before the guest runs) with confinement on and off: the cost the
// launcher stage, jail, seccomp filter and console drainer add to a box's
// cold start. go test -run - -bench Launch ./internal/vmm/qemu/
func BenchmarkLaunch(b *testing.B) {
	k, _, err := assets.FindKernel("")
	if err != nil {
		b.Skipf("no guest kernel: %v", err)
	}
	for _, mode := range []struct {
		name string
		off  bool
	}{{"confined", false}, {"unconfined", true}} {
		b.Run(mode.name, func(b *testing.B) {
			top := b.TempDir()
			disk := filepath.Join(top, "disk")
			os.WriteFile(disk, make([]byte, 1<<20), 0o600)
			for i := 0; i < b.N; i++ {
				// A directory per start: a killed QEMU may still hold the
				// last one's pid file lock for a moment.
				dir, _ := os.MkdirTemp(top, "vm")
				c := qemu.Config{
					Name: "airlock-bench-launch", Accel: qemu.AccelTCG, MemoryMiB: 256,
					Kernel: k.Path, Cmdline: "console=ttyS0 panic=-1 quiet",
					Disks:        []qemu.Disk{{Path: disk}},
					AgentSockets: []string{filepath.Join(dir, "a0.sock"), filepath.Join(dir, "a1.sock")},
					QMPSocket:    filepath.Join(dir, "q.sock"), ConsoleLog: filepath.Join(dir, "console.log"),
					PIDFile: filepath.Join(dir, "qemu.pid"), Secret: []byte("s"), THP: qemu.THPCode,
					Jail: qemu.Jail{Off: mode.off},
				}
				pid, err := qemu.Launch(context.Background(), c)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				vmm.Kill(vmm.Handle{PID: pid, Start: vmm.StartTime(pid)})
				b.StartTimer()
			}
		})
	}
}
