//go:build linux

package guestinit

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// rtnl is a minimal rtnetlink client: the three requests the guest needs to
// configure a link (up, IPv4 address, default route). A library (and its
// package initialisation, ~10 ms under TCG) is more than that needs.
type rtnl struct {
	fd  int
	seq uint32
}

func openRtnl() (*rtnl, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &rtnl{fd: fd}, nil
}

func (r *rtnl) close() { unix.Close(r.fd) }

// attr appends an rtattr holding data.
func attr(b []byte, typ uint16, data []byte) []byte {
	n := unix.SizeofRtAttr + len(data)
	b = binary.NativeEndian.AppendUint16(b, uint16(n))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for n%unix.RTA_ALIGNTO != 0 {
		b = append(b, 0)
		n++
	}
	return b
}

// request sends one message and waits for the kernel's acknowledgement.
func (r *rtnl) request(typ, flags uint16, body []byte) error {
	r.seq++
	b := make([]byte, 0, unix.NLMSG_HDRLEN+len(body))
	b = binary.NativeEndian.AppendUint32(b, uint32(unix.NLMSG_HDRLEN+len(body)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	b = binary.NativeEndian.AppendUint32(b, r.seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, body...)
	if err := unix.Sendto(r.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(r.fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != r.seq || m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
				return unix.Errno(-e)
			}
			return nil
		}
	}
}

// linkUp sets the link with index idx up (ip link set dev X up).
func (r *rtnl) linkUp(idx int) error {
	b := []byte{unix.AF_UNSPEC, 0, 0, 0}
	b = binary.NativeEndian.AppendUint32(b, uint32(idx))
	b = binary.NativeEndian.AppendUint32(b, unix.IFF_UP) // flags
	b = binary.NativeEndian.AppendUint32(b, unix.IFF_UP) // change
	return r.request(unix.RTM_NEWLINK, 0, b)
}

// addAddr adds an IPv4 address with its prefix to link idx (ip addr add).
func (r *rtnl) addAddr(idx int, p netip.Prefix) error {
	b := []byte{unix.AF_INET, byte(p.Bits()), 0, unix.RT_SCOPE_UNIVERSE}
	b = binary.NativeEndian.AppendUint32(b, uint32(idx))
	a := p.Addr().As4()
	b = attr(b, unix.IFA_LOCAL, a[:])
	b = attr(b, unix.IFA_ADDRESS, a[:])
	return r.request(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, b)
}

// addDefaultRoute adds an IPv4 default route via gw on link idx (ip route
// add default via GW dev X).
func (r *rtnl) addDefaultRoute(idx int, gw netip.Addr) error {
	b := []byte{unix.AF_INET, 0, 0, 0, unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST}
	b = binary.NativeEndian.AppendUint32(b, 0)
	g := gw.As4()
	b = attr(b, unix.RTA_GATEWAY, g[:])
	b = attr(b, unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(idx)))
	return r.request(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, b)
}

// linkIndex returns the index of the network interface name.
func linkIndex(name string) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, err
	}
	return int(ifr.Uint32()), nil
}
