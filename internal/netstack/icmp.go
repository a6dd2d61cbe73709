package netstack

import (
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Pings (ICMP echo requests) the box sends to anything but the gateway are
// NATed here, outside the stack: the stack, promiscuous to take every
// flow, would otherwise answer pings to any address itself. An allowed ping
// is sent from the host with an unprivileged ICMP socket where the host
// allows them (net.ipv4.ping_group_range), else a raw one (CAP_NET_RAW),
// and the reply is handed back to the box as if from the destination.

const (
	maxPings    = 32 // in flight at once; more are dropped
	pingTimeout = 3 * time.Second
)

var pingID atomic.Uint32

// handleEcho takes a frame carrying an IPv4 ICMP echo request from the box
// to dst, not for the gateway.
func (n *Net) handleEcho(frame []byte, dst netip.Addr) {
	v := n.e.Check("icmp", netip.AddrPortFrom(dst, 0))
	if v.Allow {
		if why := n.e.admit(); why != "" {
			v = deny(why)
		}
	}
	if !v.Allow {
		n.e.Deny("icmp", dst.String(), v.Reason)
		return
	}
	if n.pings.Add(1) > maxPings {
		n.pings.Add(-1)
		return
	}
	req := append([]byte(nil), frame...)
	go func() {
		defer n.pings.Add(-1)
		n.ping(req, v.Dial.Addr())
	}()
}

// ping sends the echo request in frame to target from the host and writes
// the reply, if one comes within pingTimeout, to the box.
func (n *Net) ping(frame []byte, target netip.Addr) {
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	req := header.ICMPv4(ip.Payload())
	if len(req) < header.ICMPv4MinimumSize {
		return
	}
	id, seq := req.Ident(), req.Sequence()
	payload := append([]byte(nil), req[header.ICMPv4MinimumSize:]...)
	privileged := false
	c, err := icmp.ListenPacket("udp4", "0.0.0.0")
	if err != nil {
		if c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0"); err != nil {
			n.e.Deny("icmp", netip.AddrFrom4(ip.DestinationAddress().As4()).String(), "this host allows airlock no ICMP socket (ping_group_range, CAP_NET_RAW)")
			return
		}
		privileged = true
	}
	defer c.Close()
	myID := int(uint16(pingID.Add(1)))
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: myID, Seq: int(seq), Data: payload}}
	wb, err := msg.Marshal(nil)
	if err != nil {
		return
	}
	var to net.Addr = &net.UDPAddr{IP: target.AsSlice()}
	if privileged {
		to = &net.IPAddr{IP: target.AsSlice()}
	}
	if _, err := c.WriteTo(wb, to); err != nil {
		return
	}
	n.e.bytesOut.Add(uint64(len(payload)))
	c.SetReadDeadline(time.Now().Add(pingTimeout))
	rb := make([]byte, 65536)
	for {
		k, from, err := c.ReadFrom(rb)
		if err != nil {
			return
		}
		m, err := icmp.ParseMessage(1, rb[:k])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		echo, ok := m.Body.(*icmp.Echo)
		if !ok || echo.Seq != int(seq) || (privileged && echo.ID != myID) {
			continue
		}
		if fa, ok := netip.AddrFromSlice(addrIP(from)); !ok || fa.Unmap() != target {
			continue
		}
		n.e.bytesIn.Add(uint64(len(echo.Data)))
		n.replyEcho(frame, id, seq, echo.Data)
		return
	}
}

func addrIP(a net.Addr) net.IP {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.IP
	case *net.IPAddr:
		return a.IP
	}
	return nil
}

// replyEcho writes to the box the echo reply to the request in frame.
func (n *Net) replyEcho(frame []byte, id, seq uint16, data []byte) {
	l := n.link.Load()
	if l == nil {
		return
	}
	reqEth := header.Ethernet(frame)
	reqIP := header.IPv4(frame[header.EthernetMinimumSize:])
	icmpLen := header.ICMPv4MinimumSize + len(data)
	out := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+icmpLen)
	header.Ethernet(out).Encode(&header.EthernetFields{SrcAddr: reqEth.DestinationAddress(), DstAddr: reqEth.SourceAddress(), Type: header.IPv4ProtocolNumber})
	ip := header.IPv4(out[header.EthernetMinimumSize:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(header.IPv4MinimumSize + icmpLen),
		ID:          uint16(pingID.Load()),
		TTL:         64,
		Protocol:    uint8(header.ICMPv4ProtocolNumber),
		SrcAddr:     reqIP.DestinationAddress(),
		DstAddr:     reqIP.SourceAddress(),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	ic := header.ICMPv4(ip[header.IPv4MinimumSize:])
	ic.SetType(header.ICMPv4EchoReply)
	ic.SetCode(0)
	ic.SetIdent(id)
	ic.SetSequence(seq)
	copy(ic[header.ICMPv4MinimumSize:], data)
	ic.SetChecksum(0)
	ic.SetChecksum(^checksum.Checksum(ic, 0))
	l.writeFrame(out)
}
