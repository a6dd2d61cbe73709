package transport

import (
	"encoding/binary"
	"io"
	"sync"
)

// joinMax is the largest data frame body joinWriter writes together with
// its header (bytes): past it the copy costs more than the second write.
const joinMax = 64 << 10

// joinWriter is the connection as yamux sees it, on both sides: yamux
// (v0.1.2, Session.sendLoop) writes a data frame's 12-byte header and its
// body in two writes. On the guest side each write to the virtio-serial
// port is a virtqueue kick, which under TCG costs the vCPU an exit to QEMU
// and QEMU a write to its socket; on the host side each is a write QEMU
// may pass to the guest as a buffer and an interrupt of its own. The
// joiner holds the header of a data frame whose body is at most joinMax
// and writes it with the body, in one write: a short exec is about half
// as many port writes. Every other write (window updates, pings, a data
// frame without a body) goes through at once.
type joinWriter struct {
	io.ReadWriteCloser

	mu   sync.Mutex
	held bool              // hdr waits for its body
	hdr  [yamuxHeader]byte // the held header
	want int               // the held header's body length
	buf  []byte            // header and body, reused
}

func newJoinWriter(c io.ReadWriteCloser) *joinWriter { return &joinWriter{ReadWriteCloser: c} }

// Write writes p, or holds it when it is a data frame's header with a
// body of at most joinMax (see joinWriter).
func (j *joinWriter) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.held {
		j.held = false
		if len(p) == j.want {
			j.buf = append(append(j.buf[:0], j.hdr[:]...), p...)
			n, err := j.ReadWriteCloser.Write(j.buf)
			return max(n-yamuxHeader, 0), err
		}
		// Not the body announced (yamux never does this): the header
		// goes first, alone, as it would have.
		if _, err := j.ReadWriteCloser.Write(j.hdr[:]); err != nil {
			return 0, err
		}
	}
	if len(p) == yamuxHeader && p[1] == yamuxTypeData {
		if n := binary.BigEndian.Uint32(p[8:12]); n > 0 && n <= joinMax {
			copy(j.hdr[:], p)
			j.held, j.want = true, int(n)
			return len(p), nil
		}
	}
	return j.ReadWriteCloser.Write(p)
}
