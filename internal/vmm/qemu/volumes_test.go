package qemu

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/vmm"
)

// TestVirtioFSVolumes: with the virtio-fs transport a host directory
// becomes a vhost-user-fs device on a socket in the box's directory, guest
// RAM one shared memfd (instead of THPCode's split layout, whose private
// parts a daemon could not map) and a virtiofs volume parameter; named
// volumes stay disks; with 9p nothing of that is there.
func TestVirtioFSVolumes(t *testing.T) {
	d := New(Options{VolumeTransport: TransportVirtioFS})
	boot := &bootAssets{accel: AccelChoice{Accel: AccelTCG}, thp: THPCode}
	spec := vmm.Spec{ID: "0123456789ab", Dir: t.TempDir(), CPUs: 1, MemoryMiB: 256, Volumes: []vmm.Volume{
		{HostDir: "/src", Target: "/src", ReadOnly: true}, {Disk: "/v.ext4", Target: "/data"}}}
	c := d.config(spec, boot, "/base", 0)
	args := strings.Join(c.Args(), " ")
	sock := filepath.Join(spec.Dir, "virtiofs-0.sock")
	for _, want := range []string{"-chardev socket,id=vol0,path=" + sock, "vhost-user-fs-device,chardev=vol0,tag=airlock.vol0",
		"memory-backend-memfd,id=airlock-ram,size=256M,share=on", "-machine memory-backend=airlock-ram"} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %q: %s", want, args)
		}
	}
	if strings.Contains(args, "-numa") || strings.Contains(args, "virtio-9p") || c.THP != THPAll {
		t.Errorf("THPCode layout or 9p left in: %s", args)
	}
	if !strings.Contains(c.Cmdline, "airlock.vol=virtiofs:airlock.vol0:") || !strings.Contains(c.Cmdline, "airlock.vol=blk:") {
		t.Errorf("cmdline: %s", c.Cmdline)
	}
	if sh := specShares(spec, TransportVirtioFS); len(sh) != 1 || sh[0].sock != sock || !sh[0].ro || sh[0].source != "/src" {
		t.Errorf("shares: %+v", sh)
	}
	d = New(Options{})
	c = d.config(spec, boot, "/base", 0)
	if args := strings.Join(c.Args(), " "); strings.Contains(args, "vhost-user") || !strings.Contains(args, "virtio-9p-device") || strings.Contains(args, "share=on") {
		t.Errorf("9p: %s", args)
	}
	if _, err := CheckTransport("nfs"); err == nil {
		t.Error("CheckTransport(nfs) accepted")
	}
}
