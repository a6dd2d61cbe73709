// Package guestabi holds the agreements between the host and the guest
// agent that are not protocol messages: the airlock.* kernel parameters
// (Boot, Volume), the names of the agent's virtio-serial ports, the agent's
// console log prefix the host searches, and the /etc files the agent
// provides. The host (internal/vmm/qemu, internal/rootfs) and the guest
// (internal/guestinit, cmd/airlock-agent) both take them from here, so they
// cannot drift apart. It imports only small standard library packages
// (strings, strconv, encoding/hex, path, fmt): it is linked into the guest
// agent.
package guestabi

import (
	"strconv"
	"strings"
)

// PortPrefix starts the names of the agent's virtio-serial ports.
const PortPrefix = "airlock.agent."

// PortName returns the name of the agent's i-th virtio-serial port.
func PortName(i int) string { return PortPrefix + strconv.Itoa(i) }

// UserNetIPParam is the kernel's ip= parameter (CONFIG_IP_PNP) that gives
// eth0 the address and default route of QEMU user networking (slirp's
// defaults: guest 10.0.2.15/24, gateway 10.0.2.2, DNS 10.0.2.3), so that
// the kernel configures the network before /init. The guest agent has the
// same addresses for kernels without IP_PNP.
const UserNetIPParam = "ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off"

// NetUser is Boot.Net for QEMU user networking.
const NetUser = "user"

// Boot is the airlock.* kernel command line parameters: the host encodes
// them with Args, the guest agent reads them with ParseCmdline.
type Boot struct {
	Root       string // airlock.root: image base device, default /dev/vda (/dev/vdb after the agent disk)
	RootFSType string // airlock.rootfstype: default erofs
	RW         string // airlock.rw: writable layer device ("" = tmpfs)
	Port       string // airlock.port: prefix of the virtio-serial port names, default PortPrefix
	Hostname   string // airlock.hostname, default "airlock"
	Net        string // airlock.net: NetUser = QEMU user networking, "" = none
	VsockPort  uint32 // airlock.vsock: also serve on this AF_VSOCK port (0 = not)
	Ports      int    // airlock.ports: how many agent ports to expect (0 = any)
	Debug      bool   // airlock.debug: log boot phases with their uptime
	// KernelIP is set when the command line has ip=: the kernel (with
	// CONFIG_IP_PNP) has already brought lo and eth0 up with their address
	// and default route. Args adds UserNetIPParam for it.
	KernelIP bool
}

// Defaults returns the parameters of an empty command line.
func Defaults() Boot {
	return Boot{Root: "/dev/vda", RootFSType: "erofs", Port: PortPrefix, Hostname: "airlock"}
}

// Args returns the kernel parameters that make ParseCmdline return b
// (those that differ from Defaults). Hostname must not contain spaces (the
// host passes a validated name).
func (b Boot) Args() []string {
	d := Defaults()
	var a []string
	add := func(k, v, def string) {
		if v != def {
			a = append(a, k+"="+v)
		}
	}
	add("airlock.root", b.Root, d.Root)
	add("airlock.rootfstype", b.RootFSType, d.RootFSType)
	add("airlock.rw", b.RW, "")
	add("airlock.port", b.Port, d.Port)
	add("airlock.hostname", b.Hostname, d.Hostname)
	add("airlock.net", b.Net, "")
	if b.VsockPort != 0 {
		a = append(a, "airlock.vsock="+strconv.FormatUint(uint64(b.VsockPort), 10))
	}
	if b.Ports != 0 {
		a = append(a, "airlock.ports="+strconv.Itoa(b.Ports))
	}
	if b.Debug {
		a = append(a, "airlock.debug=1")
	}
	if b.KernelIP {
		a = append(a, UserNetIPParam)
	}
	return a
}

// ParseCmdline reads the airlock.* parameters from a kernel command line.
// Unknown parameters are ignored; malformed numbers read as 0.
func ParseCmdline(cmdline string) Boot {
	p := Defaults()
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "airlock.root":
			p.Root = v
		case "airlock.rootfstype":
			p.RootFSType = v
		case "airlock.rw":
			p.RW = v
		case "airlock.port":
			p.Port = v
		case "airlock.hostname":
			p.Hostname = v
		case "airlock.net":
			p.Net = v
		case "airlock.ports":
			p.Ports, _ = strconv.Atoi(v)
		case "ip":
			p.KernelIP = v != "" && v != "off" && v != "none"
		case "airlock.debug":
			p.Debug = v != "0"
		case "airlock.vsock":
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				p.VsockPort = uint32(n)
			}
		}
	}
	return p
}

// KnownParam reports whether f, one field of a kernel command line, is a
// parameter Boot.Args or Volume.Arg writes (or BareParam), with a value of
// the form the host writes. The host holds a command line that came from
// elsewhere (a snapshot's, an imported memory archive's) to these before it
// hands it to the VMM: anything else (init=, a module parameter, a "--"
// tail for /init) is not airlock's.
func KnownParam(f string) bool {
	if f == UserNetIPParam || f == BareParam || testFaultParam(f) {
		return true
	}
	k, v, ok := strings.Cut(f, "=")
	if !ok {
		return false
	}
	switch k {
	case "airlock.root", "airlock.rw":
		d, ok := strings.CutPrefix(v, "/dev/vd")
		return ok && d != "" && len(d) <= 3 && onlyOf(d, "abcdefghijklmnopqrstuvwxyz")
	case "airlock.rootfstype":
		return v != "" && len(v) <= 16 && onlyOf(v, "abcdefghijklmnopqrstuvwxyz0123456789")
	case "airlock.port", "airlock.hostname":
		// A spec without a hostname writes an empty one.
		return (v != "" || k == "airlock.hostname") && len(v) <= 253 && onlyOf(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")
	case "airlock.net":
		return v == NetUser
	case "airlock.vsock":
		_, err := strconv.ParseUint(v, 10, 32)
		return err == nil
	case "airlock.ports":
		n, err := strconv.Atoi(v)
		return err == nil && n > 0 && n <= 64
	case "airlock.debug":
		return v == "1"
	case "airlock.vol":
		vols, err := ParseVolumes(f)
		return err == nil && len(vols) == 1 && vols[0].Source != "" &&
			onlyOf(vols[0].Source, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")
	}
	return false
}

// onlyOf reports whether every byte of s is one of set.
func onlyOf(s, set string) bool {
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(set, s[i]) < 0 {
			return false
		}
	}
	return true
}
