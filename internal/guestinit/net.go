//go:build linux

package guestinit

import (
	"fmt"
	"net/netip"
	"time"
)

// QEMU user-mode networking (slirp) addresses (also in guestabi.UserNetIPParam).
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
	r, err := openRtnl()
	if err != nil {
		return err
	}
	defer r.close()
	if lo, err := linkIndex("lo"); err == nil {
		r.linkUp(lo)
	}
	if mode != "user" {
		return nil
	}
	var eth int
	for i := 0; i < 200; i++ {
		if eth, err = linkIndex("eth0"); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	if err := r.addAddr(eth, netip.MustParsePrefix(userNetAddr)); err != nil {
		return fmt.Errorf("eth0 address: %w", err)
	}
	if err := r.linkUp(eth); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	if err := r.addDefaultRoute(eth, netip.MustParseAddr(userNetGW)); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return writeResolvConf()
}

// writeResolvConf points the box's resolver at QEMU's user-network DNS.
func writeResolvConf() error {
	return provideEtcFile("resolv.conf", []byte("nameserver "+userNetDNS+"\n"), true)
}
