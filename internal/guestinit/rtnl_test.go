//go:build linux

package guestinit

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The rtnetlink requests configure a link as `ip` would: run in a private
// network namespace (needs root), on its loopback device.
func TestRtnlConfiguresLink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private network namespace")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread stays in the new namespace: never unlock it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		r, err := openRtnl()
		if err != nil {
			t.Error(err)
			return
		}
		defer r.close()
		lo, err := linkIndex("lo")
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := linkIndex("no-such-link0"); err == nil {
			t.Error("linkIndex of a missing link succeeded")
		}
		if err := r.linkUp(lo); err != nil {
			t.Errorf("link up: %v", err)
		}
		if err := r.addAddr(lo, netip.MustParsePrefix("10.0.2.15/24")); err != nil {
			t.Errorf("add address: %v", err)
		}
		if err := r.addAddr(lo, netip.MustParsePrefix("10.0.2.15/24")); !errors.Is(err, unix.EEXIST) {
			t.Errorf("adding the address again: %v, want EEXIST", err)
		}
		if err := r.addDefaultRoute(lo, netip.MustParseAddr("10.0.2.2")); err != nil {
			t.Errorf("add default route: %v", err)
		}
		// Kernel's view: flags, address and route.
		ifr, _ := unix.NewIfreq("lo")
		fd, _ := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		defer unix.Close(fd)
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil || ifr.Uint16()&unix.IFF_UP == 0 {
			t.Errorf("lo not up: flags %#x %v", ifr.Uint16(), err)
		}
		ifc, err := net.InterfaceByIndex(lo)
		if err != nil {
			t.Error(err)
			return
		}
		if addrs, err := ifc.Addrs(); err != nil || !strings.Contains(fmt.Sprint(addrs), "10.0.2.15/24") {
			t.Errorf("lo addresses %v %v, want 10.0.2.15/24 among them", addrs, err)
		}
		routes, err := os.ReadFile("/proc/thread-self/net/route")
		// default route: destination 0, gateway 10.0.2.2 (0202000A little endian)
		if err != nil || !strings.Contains(string(routes), "lo\t00000000\t0202000A") {
			t.Errorf("no default route via 10.0.2.2 on lo:\n%s %v", routes, err)
		}
	}()
	<-done
}
