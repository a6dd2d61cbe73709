// Package headtail keeps the head and the tail of a byte stream that may be
// too long to keep whole: the first half of a budget passes through as it
// arrives, the last half is held in a ring and released at the end, and
// what falls between is counted and dropped. The guest agent uses it so that
// dropped output never crosses the transport; the host uses it again on
// what arrives, so a misbehaving agent cannot grow host memory either.
package headtail

import (
	"bufio"
	"sync"
)

// Limiter splits a stream into a head that passes at once, a tail kept in
// memory (at most max - max/2 bytes) and a dropped middle.
type Limiter struct {
	headLeft int64 // bytes that may still pass at once
	tailMax  int
	buf      []byte // ring of the last tailMax bytes, once full
	pos      int    // start of the oldest byte in buf, once full
	dropped  int64
}

// NewLimiter returns a Limiter that keeps at most max bytes in all: the
// first max/2 rounded up, and the last max/2. max must be positive.
func NewLimiter(max int64) *Limiter {
	tail := max / 2
	return &Limiter{headLeft: max - tail, tailMax: int(tail)}
}

// Write takes the next bytes of the stream and returns the part of p that
// belongs to the head (a sub-slice of p, possibly empty); the rest is kept
// for the tail, pushing older tail bytes out.
func (l *Limiter) Write(p []byte) (head []byte) {
	if l.headLeft > 0 {
		n := int(min(int64(len(p)), l.headLeft))
		l.headLeft -= int64(n)
		head, p = p[:n], p[n:]
	}
	if len(p) > 0 {
		l.keep(p)
	}
	return head
}

func (l *Limiter) keep(p []byte) {
	if l.tailMax == 0 {
		l.dropped += int64(len(p))
		return
	}
	if len(p) >= l.tailMax {
		l.dropped += int64(len(l.buf)) + int64(len(p)-l.tailMax)
		l.buf = append(l.buf[:0], p[len(p)-l.tailMax:]...)
		l.pos = 0
		return
	}
	if room := l.tailMax - len(l.buf); room > 0 {
		n := min(room, len(p))
		l.buf = append(l.buf, p[:n]...)
		p = p[n:]
	}
	l.dropped += int64(len(p))
	for len(p) > 0 {
		n := copy(l.buf[l.pos:], p)
		p = p[n:]
		l.pos = (l.pos + n) % l.tailMax
	}
}

// Tail returns the kept tail in stream order (a new slice).
func (l *Limiter) Tail() []byte {
	out := make([]byte, 0, len(l.buf))
	out = append(out, l.buf[l.pos:]...)
	return append(out, l.buf[:l.pos]...)
}

// Dropped is the number of bytes neither passed as head nor kept as tail.
func (l *Limiter) Dropped() int64 { return l.dropped }

// reserveAtOnce is the largest budget a Buffer allocates whole once its
// content passes 1 MiB; larger budgets grow as append grows them.
const reserveAtOnce = 64 << 20

// Buffer is an io.Writer that keeps a Limiter's head and tail of what is
// written to it. Up to max bytes it holds one slice, so a stream within the
// budget costs no second copy. A Buffer with max <= 0 keeps everything.
type Buffer struct {
	max int64
	all []byte   // everything, while within max; then the head
	l   *Limiter // once past max
}

// NewBuffer returns a Buffer keeping at most max bytes (see NewLimiter);
// max <= 0 keeps every byte.
func NewBuffer(max int64) *Buffer { return &Buffer{max: max} }

// Write keeps p's head part and tail part; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	switch {
	case b.l != nil:
		b.all = append(b.all, b.l.Write(p)...)
	case b.max <= 0:
		b.all = append(b.all, p...)
	case int64(len(b.all)+len(p)) <= b.max:
		if n := len(b.all) + len(p); n > cap(b.all) && n > 1<<20 && b.max <= reserveAtOnce {
			// Past 1 MiB, room for the whole budget at once: no chain of
			// doubling copies, whose garbage would grow the heap to twice
			// the budget and more.
			all := make([]byte, len(b.all), b.max)
			copy(all, b.all)
			b.all = all
		}
		b.all = append(b.all, p...)
	default:
		// Past the budget: the first part of what is held is the head,
		// the rest and p go through a Limiter.
		b.l = NewLimiter(b.max)
		held := b.all
		b.all = held[:len(b.l.Write(held))]
		b.all = append(b.all, b.l.Write(p)...)
	}
	return len(p), nil
}

// Bytes returns the head followed by the tail.
func (b *Buffer) Bytes() []byte {
	if b.l == nil {
		return b.all
	}
	t := b.l.Tail()
	out := make([]byte, len(b.all)+len(t))
	copy(out[copy(out, b.all):], t)
	return out
}

// Dropped is the number of bytes written but not kept.
func (b *Buffer) Dropped() int64 {
	if b.l == nil {
		return 0
	}
	return b.l.Dropped()
}

// Tail keeps the last Max bytes written to it (a process's stderr, for
// an error message); safe for concurrent use.
type Tail struct {
	// Max is how many bytes are kept.
	Max int
	mu  sync.Mutex
	b   []byte
}

// Write keeps the end of what was written; it never fails.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.Max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.Max:]...)
	}
	return len(p), nil
}

// String returns what is kept.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// ReadLine reads one '\n'-terminated line of at most max bytes from r (a
// guest's output: its length is not ours to choose). A longer line is read
// through its newline and discarded (tooLong), so memory stays bounded
// however long the line is, newline or not.
func ReadLine(r *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > max {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, tooLong, err
	}
}
