package qemu_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/rootfs"

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
	// The lifecycle code prepares the disks above the seam; so does this
	// harness: the image's base in the cache, an empty layer per box.
	base, err := rootfs.Base(context.Background(), images, img, defaults.Cache())
	if err != nil {
		t.Fatal(err)
	}
	d := qemu.New(qemu.Options{AgentPath: agent, CacheDir: defaults.Cache(), Warn: func(m string) { t.Log("warn: ", m) }})
	vmmtest.Suite(t, vmmtest.Harness{
		Driver: d,
		Spec: func(t *testing.T, id, dir string) vmm.Spec {
			return vmm.Spec{ID: id, Dir: dir, CPUs: 1, MemoryMiB: 256, DiskSizeMiB: 4096, Hostname: id,
				Disks: vmm.Disks{Base: base, Layer: filepath.Join(dir, boxdir.RW)}}
		},
		Prepare: func(t *testing.T, spec vmm.Spec) {
			if err := rootfs.NewDisk(spec.Disks.Layer, spec.DiskSizeMiB, defaults.Cache()); err != nil {
				t.Fatal(err)
			}
		},
		Files:       func(vmm.Spec) string { return "/root" },
		BootTimeout: 2 * time.Minute,
	})
}
