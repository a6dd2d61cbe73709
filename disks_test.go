package airlock_test

import (
	"context"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// diskDriver is the fake driver as one that boots from disks
// (vmm.DiskBooter, when disks is set): it keeps the Spec.Disks each Create
// and Start got, and whether their files were there at the call.
type diskDriver struct {
	*fake.Driver
	disks bool

	mu    sync.Mutex
	calls []diskCall
}

type diskCall struct {
	op              string
	disks           vmm.Disks
	baseOK, layerOK bool
	layerSize       int64
	diskSizeMiB     int
	layerInBoxDir   bool
}

func (d *diskDriver) BootsFromDisks() bool { return d.disks }

func (d *diskDriver) note(op string, spec vmm.Spec) {
	c := diskCall{op: op, disks: spec.Disks, diskSizeMiB: spec.DiskSizeMiB,
		layerInBoxDir: spec.Disks.Layer == filepath.Join(spec.Dir, "rw.ext4")}
	if fi, err := os.Stat(spec.Disks.Base); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		c.baseOK = true
	}
	if fi, err := os.Stat(spec.Disks.Layer); err == nil && fi.Mode().IsRegular() {
		c.layerOK, c.layerSize = true, fi.Size()
	}
	d.mu.Lock()
	d.calls = append(d.calls, c)
	d.mu.Unlock()
}

func (d *diskDriver) Create(ctx context.Context, spec vmm.Spec) error {
	d.note("create", spec)
	return d.Driver.Create(ctx, spec)
}

func (d *diskDriver) Start(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	d.note("start", spec)
	return d.Driver.Start(ctx, spec)
}

func (d *diskDriver) taken() []diskCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.calls
	d.calls = nil
	return c
}

// TestDriverGetsPreparedDisks: the lifecycle code builds a box's disks
// above the driver seam and hands a driver that boots from disks their
// paths: the image's root filesystem base (in the cache) and the box's
// own empty writable layer of the box's disk size (rw.ext4 in the box
// directory, the name every release used), both there when Create and
// Start are called; a base the cache lost is built again for the next
// start. A driver that does not boot from disks (the fake) gets none, and
// the box directory holds no writable layer.
func TestDriverGetsPreparedDisks(t *testing.T) {
	for _, tool := range []string{"mkfs.erofs", "mkfs.ext4"} {
		if _, err := osexec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (erofs-utils, e2fsprogs)", tool)
		}
	}
	ctx := context.Background()
	for _, boots := range []bool{true, false} {
		drv := &diskDriver{Driver: fake.New(os.Getenv("AIRLOCK_AGENT")), disks: boots} // built by vmtest.Main
		const ref = "test/fake:v1"
		cache := t.TempDir()
		r, err := airlock.OpenWithDriver(airlock.Options{Home: t.TempDir(), ImagesDir: fakeImageStore(t, ref), CacheDir: cache, Warn: func(string) {}}, drv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		b, err := r.Create(ctx, airlock.BoxOptions{Image: ref, DiskSizeMiB: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Remove(context.WithoutCancel(ctx), true)
		layer := filepath.Join(r.Home(), "boxes", b.ID(), "rw.ext4")
		calls := drv.taken()
		if !boots {
			for _, c := range calls {
				if c.disks != (vmm.Disks{}) {
					t.Errorf("%s on a driver that does not boot from disks got disks %+v", c.op, c.disks)
				}
			}
			if _, err := os.Stat(layer); err == nil {
				t.Errorf("a box of a driver that does not boot from disks has a writable layer %s", layer)
			}
			continue
		}
		if len(calls) != 2 || calls[0].op != "create" || calls[1].op != "start" {
			t.Fatalf("driver calls %+v, want create then start", calls)
		}
		for _, c := range calls {
			if !c.baseOK || !strings.HasPrefix(c.disks.Base, filepath.Join(cache, "rootfs")+"/") || !strings.HasSuffix(c.disks.Base, ".erofs") {
				t.Errorf("%s: base %q (there: %v), want a built erofs base in %s/rootfs", c.op, c.disks.Base, c.baseOK, cache)
			}
			if !c.layerOK || c.disks.Layer != layer || !c.layerInBoxDir || c.layerSize != 64<<20 || c.diskSizeMiB != 64 {
				t.Errorf("%s: writable layer %q (there: %v, %d bytes), want %s of 64 MiB", c.op, c.disks.Layer, c.layerOK, c.layerSize, layer)
			}
		}
		if res, err := b.Exec(ctx, "sh", []string{"-c", "echo up"}, airlock.ExecOptions{}); err != nil || strings.TrimSpace(string(res.Stdout)) != "up" {
			t.Fatalf("exec in the box: %v %+v", err, res)
		}
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		base := calls[0].disks.Base
		if err := os.Remove(base); err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if c := drv.taken(); len(c) != 1 || !c[0].baseOK || c[0].disks.Base != base || c[0].disks.Layer != layer {
			t.Errorf("start after the cache lost the base: %+v, want the base built again at %s", c, base)
		}
	}
}
