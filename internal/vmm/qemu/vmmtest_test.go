package qemu_test

import (
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
	"github.com/airlock-run/airlock/internal/vmm/vmmtest"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestDriverSuite: the QEMU driver passes the driver conformance suite,
// every case of it (two machines: one booted, one restored from its
// snapshot).
func TestDriverSuite(t *testing.T) {
	vmtest.Require(t)
	agent, err := vmtest.BuildAgent(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	images, err := image.Open(vmtest.ImagesDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := images.Resolve(vmtest.DefaultImage)
	if err != nil {
		t.Fatal(err)
	}
	d := qemu.New(qemu.Options{AgentPath: agent, CacheDir: defaults.Cache(), Warn: func(m string) { t.Log("warn: ", m) }})
	vmmtest.Suite(t, vmmtest.Harness{
		Driver: d,
		Spec: func(t *testing.T, id, dir string) vmm.Spec {
			return vmm.Spec{ID: id, Dir: dir, CPUs: 1, MemoryMiB: 256, DiskSizeMiB: 4096, Hostname: id, Images: images, Image: img}
		},
		Files:       func(vmm.Spec) string { return "/root" },
		BootTimeout: 2 * time.Minute,
	})
}
