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

// MTU is the box's interface MTU, which QEMU's virtio-net device
// advertises to the guest (host_mtu): the largest that fits the 16-bit IP
// length with room to spare, as slirp4netns and passt use. The stack
// terminates the box's TCP connections, so the box's MTU is independent of
// the internet path's; large frames make far fewer packets for the guest
// and the stack to handle.
const MTU = 65520

// streamLink is a link endpoint on QEMU's -netdev stream protocol: each
// Ethernet frame is sent as a 4-byte big-endian length and the frame. It
// carries whole frames; ethernet.New adds and strips the Ethernet header.
//
// Writes are group commits: a writer appends its frames to the buffer and,
// unless another writer is already writing, writes the buffer out itself,
// again until it is empty; frames other writers add meanwhile go out with
// the next write. No goroutine hop on an idle link, few syscalls on a busy
// one.
type streamLink struct {
	conn net.Conn
	mac  tcpip.LinkAddress

	wmu      sync.Mutex
	wcond    *sync.Cond // signalled when the buffer has been written
	buf      []byte     // frames to write
	spare    []byte
	writing  bool
	werr     error
	closedTx bool

	mu         sync.RWMutex
	dispatcher stack.NetworkDispatcher

	// filter, when set, sees each inbound frame first; true means it
	// consumed it.
	filter func(frame []byte) bool
}

// maxPending bounds the frames buffered while a write is in progress;
// writers wait beyond it (QEMU is not reading: the guest is not taking
// frames).
const maxPending = 1 << 20

func newStreamLink(conn net.Conn, mac tcpip.LinkAddress) *streamLink {
	l := &streamLink{conn: conn, mac: mac}
	l.wcond = sync.NewCond(&l.wmu)
	return l
}

// queue appends frames via add and writes the buffer out unless another
// writer does. Preconditions: l.wmu is not held.
func (l *streamLink) queue(add func()) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for l.writing && len(l.buf) > maxPending && l.werr == nil && !l.closedTx {
		l.wcond.Wait()
	}
	if l.werr != nil || l.closedTx {
		return net.ErrClosed
	}
	add()
	if l.writing {
		return nil
	}
	l.writing = true
	for len(l.buf) > 0 && l.werr == nil {
		b := l.buf
		l.buf = l.spare[:0]
		l.wmu.Unlock()
		_, err := l.conn.Write(b)
		l.wmu.Lock()
		if cap(b) <= 4*maxPending {
			l.spare = b
		}
		if err != nil {
			l.werr = err
		}
		l.wcond.Broadcast()
	}
	l.writing = false
	return l.werr
}

func appendFrameHeader(b []byte, n int) []byte {
	return binary.BigEndian.AppendUint32(b, uint32(n))
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
	n := 0
	err := l.queue(func() {
		for _, pkt := range pkts.AsSlice() {
			l.buf = appendFrameHeader(l.buf, pkt.Size())
			for _, s := range pkt.AsSlices() {
				l.buf = append(l.buf, s...)
			}
			n++
		}
	})
	if err != nil && n == 0 {
		return 0, &tcpip.ErrClosedForSend{}
	}
	return n, nil
}

// writeFrame sends one frame built outside the stack.
func (l *streamLink) writeFrame(frame []byte) error {
	return l.queue(func() {
		l.buf = appendFrameHeader(l.buf, len(frame))
		l.buf = append(l.buf, frame...)
	})
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

// stop makes further writes fail (after the stack stopped writing).
func (l *streamLink) stop() {
	l.wmu.Lock()
	l.closedTx = true
	l.wcond.Broadcast()
	l.wmu.Unlock()
}
