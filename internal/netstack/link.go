package netstack

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// maxFrame bounds an Ethernet frame read from QEMU (the guest controls
// them): the MTU plus the Ethernet header, with room for a VLAN tag.
const maxFrame = MTU + header.EthernetMinimumSize + 4

// MTU is the box's interface MTU (QEMU's virtio-net default).
const MTU = 1500

// streamLink is a link endpoint on QEMU's -netdev stream protocol: each
// Ethernet frame is sent as a 4-byte big-endian length and the frame. It
// carries whole frames; ethernet.New adds and strips the Ethernet header.
type streamLink struct {
	conn net.Conn
	mac  tcpip.LinkAddress

	wmu sync.Mutex
	w   *bufio.Writer

	mu         sync.RWMutex
	dispatcher stack.NetworkDispatcher

	// filter, when set, sees each inbound frame first; true means it
	// consumed it.
	filter func(frame []byte) bool
}

func newStreamLink(conn net.Conn, mac tcpip.LinkAddress) *streamLink {
	return &streamLink{conn: conn, mac: mac, w: bufio.NewWriterSize(conn, 256<<10)}
}

func (l *streamLink) MTU() uint32                    { return MTU + header.EthernetMinimumSize }
func (l *streamLink) SetMTU(uint32)                  {}
func (l *streamLink) MaxHeaderLength() uint16        { return 0 }
func (l *streamLink) LinkAddress() tcpip.LinkAddress { return l.mac }
func (l *streamLink) SetLinkAddress(tcpip.LinkAddress) {
}
func (l *streamLink) Capabilities() stack.LinkEndpointCapabilities { return 0 }
func (l *streamLink) Attach(d stack.NetworkDispatcher) {
	l.mu.Lock()
	l.dispatcher = d
	l.mu.Unlock()
}
func (l *streamLink) IsAttached() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.dispatcher != nil
}
func (l *streamLink) Wait()                                   {}
func (l *streamLink) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }
func (l *streamLink) AddHeader(*stack.PacketBuffer)           {}
func (l *streamLink) ParseHeader(*stack.PacketBuffer) bool    { return true }
func (l *streamLink) Close()                                  { l.conn.Close() }
func (l *streamLink) SetOnCloseAction(func())                 {}

// WritePackets sends frames to QEMU.
func (l *streamLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	n := 0
	for _, pkt := range pkts.AsSlice() {
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(pkt.Size()))
		l.w.Write(hdr[:])
		for _, s := range pkt.AsSlices() {
			l.w.Write(s)
		}
		n++
	}
	if err := l.w.Flush(); err != nil {
		return n, &tcpip.ErrClosedForSend{}
	}
	return n, nil
}

// writeFrame sends one frame built outside the stack.
func (l *streamLink) writeFrame(frame []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(frame)))
	l.w.Write(hdr[:])
	l.w.Write(frame)
	return l.w.Flush()
}

// readLoop delivers QEMU's frames to the stack until the connection ends
// (QEMU exited) or QEMU sends a malformed frame.
func (l *streamLink) readLoop() error {
	r := bufio.NewReaderSize(l.conn, 256<<10)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxFrame || n < header.EthernetMinimumSize {
			return fmt.Errorf("frame of %d bytes from QEMU (want %d-%d)", n, header.EthernetMinimumSize, maxFrame)
		}
		frame := make([]byte, n)
		if _, err := io.ReadFull(r, frame); err != nil {
			return err
		}
		if l.filter != nil && l.filter(frame) {
			continue
		}
		l.mu.RLock()
		d := l.dispatcher
		l.mu.RUnlock()
		if d == nil {
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
		d.DeliverNetworkPacket(0, pkt)
		pkt.DecRef()
	}
}
