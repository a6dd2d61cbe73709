package qemu

import (
	"path/filepath"
	"strconv"
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

// TestVirtioFSJailed: a confined QEMU reaches a virtio-fs daemon through a
// descriptor the launcher stage connects (the socket is root's and not in
// the jail), numbered after the listening sockets and before the opened
// files, as the stage makes them.
func TestVirtioFSJailed(t *testing.T) {
	d := New(Options{VolumeTransport: TransportVirtioFS})
	boot := &bootAssets{accel: AccelChoice{Accel: AccelTCG}, thp: THPCode}
	spec := vmm.Spec{ID: "0123456789ab", Dir: t.TempDir(), CPUs: 1, MemoryMiB: 256, Volumes: []vmm.Volume{
		{HostDir: "/src", Target: "/src"}, {HostDir: "/etc", Target: "/etc2", ReadOnly: true}}}
	c := d.config(spec, boot, "/base", 0)
	args, s := c.jailedArgs(true)
	a := strings.Join(args, " ")
	if len(s.Connect) != 2 || s.Connect[0] != c.FSShares[0].Socket || s.Connect[1] != c.FSShares[1].Socket {
		t.Fatalf("stage connects %v; want the shares' sockets %+v", s.Connect, c.FSShares)
	}
	first := fdBase + len(s.Listen)
	for i, want := range []string{
		"-chardev socket,id=vol0,fd=" + strconv.Itoa(first) + " ",
		"-chardev socket,id=vol1,fd=" + strconv.Itoa(first+1) + " ",
		"-add-fd fd=" + strconv.Itoa(first+2) + ",set=" + strconv.Itoa(first+2),
		"share=on",
	} {
		if !strings.Contains(a, want) {
			t.Errorf("%d: args lack %q: %s", i, want, a)
		}
	}
	if strings.Contains(a, "virtiofs-0.sock") || len(s.Shares) != 0 {
		t.Errorf("a socket path or a bind of the shared directory in the jail: %s %+v", a, s.Shares)
	}
}
