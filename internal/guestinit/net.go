//go:build linux

package guestinit

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
)

// QEMU user-mode networking (slirp) addresses (also in qemu.UserNetIPParam).
const (
	userNetAddr = "10.0.2.15/24"
	userNetGW   = "10.0.2.2"
	userNetDNS  = "10.0.2.3"
)

// Network brings up loopback and, for mode "user", eth0 with QEMU's
// user-networking addresses, a default route and resolv.conf. With
// kernelIP the kernel has done all but resolv.conf (ip= on its command
// line), which spares the agent's netlink calls at boot.
func Network(mode string, kernelIP bool) error {
	if kernelIP && mode == "user" {
		return writeResolvConf()
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		netlink.LinkSetUp(lo)
	}
	if mode != "user" {
		return nil
	}
	var eth netlink.Link
	for i := 0; i < 200; i++ {
		if eth, err = netlink.LinkByName("eth0"); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	addr, _ := netlink.ParseAddr(userNetAddr)
	if err := netlink.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("eth0 address: %w", err)
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP(userNetGW)}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return writeResolvConf()
}

// writeResolvConf points the box's resolver at QEMU's user-network DNS.
func writeResolvConf() error {
	resolv := filepath.Join(NewRoot, "etc/resolv.conf")
	os.Remove(resolv) // may be a dangling symlink in the image
	return os.WriteFile(resolv, []byte("nameserver "+userNetDNS+"\n"), 0o644)
}
