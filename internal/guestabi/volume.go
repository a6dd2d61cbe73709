package guestabi

import (
	"encoding/hex"
	"fmt"
	"path"
	"strings"
)

// Volume kinds (Volume.Kind).
const (
	VolumeKind9p   = "9p"  // a host directory shared over virtio-9p; Source is the mount tag
	VolumeKindDisk = "blk" // a named volume: an ext4 virtio-blk disk; Source is its device name (vdd)
	// VolumeKindVirtioFS is a host directory shared over virtio-fs; Source is the tag.
	VolumeKindVirtioFS = "virtiofs"
)

// Volume is one volume the host attached to a box, passed to the guest as
// the kernel parameter airlock.vol=KIND:SOURCE:HEXTARGET:MODE (HEXTARGET
// the hex-encoded mount point in the box, so any path survives the command
// line; MODE ro or rw).
type Volume struct {
	Kind, Source, Target string
	ReadOnly             bool
}

// Arg returns the kernel parameter for v.
func (v Volume) Arg() string {
	mode := "rw"
	if v.ReadOnly {
		mode = "ro"
	}
	return "airlock.vol=" + strings.Join([]string{v.Kind, v.Source, hex.EncodeToString([]byte(path.Clean(v.Target))), mode}, ":")
}

// ParseVolumes returns the airlock.vol parameters of cmdline, in order.
func ParseVolumes(cmdline string) ([]Volume, error) {
	var out []Volume
	for _, f := range strings.Fields(cmdline) {
		v, ok := strings.CutPrefix(f, "airlock.vol=")
		if !ok {
			continue
		}
		p := strings.Split(v, ":")
		if len(p) != 4 || (p[0] != VolumeKind9p && p[0] != VolumeKindDisk && p[0] != VolumeKindVirtioFS) || (p[3] != "ro" && p[3] != "rw") {
			return nil, fmt.Errorf("bad volume parameter %q", f)
		}
		t, err := hex.DecodeString(p[2])
		if err != nil || !path.IsAbs(string(t)) {
			return nil, fmt.Errorf("bad volume target in %q", f)
		}
		out = append(out, Volume{Kind: p[0], Source: p[1], Target: string(t), ReadOnly: p[3] == "ro"})
	}
	return out, nil
}
