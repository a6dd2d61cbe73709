// Package boundedpipe is an in-memory pipe holding at most a fixed number
// of bytes: Write blocks while it is full, Read blocks while it is empty.
// An exec's stdout and stderr each get one, so that a full stderr does not
// stop stdout until its own buffer is full, while memory stays bounded.
package boundedpipe

import (
	"io"
	"sync"
)

// Pipe is the write side of a bounded pipe.
type Pipe struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	cap    int
	closed bool // write side closed
	rdone  bool // read side closed
}

// New returns a pipe holding at most capacity bytes: its read side (an
// io.ReadCloser behind an io.Reader; closing it discards later writes) and
// its write side.
func New(capacity int) (io.Reader, *Pipe) {
	p := &Pipe{cap: capacity}
	p.cond = sync.NewCond(&p.mu)
	return reader{p}, p
}

// Write appends b, blocking while the pipe is full; once the read side is
// closed (or DropWrites was called) the rest is discarded and reported
// written.
func (p *Pipe) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for len(b) > 0 {
		for len(p.buf) >= p.cap && !p.rdone {
			p.cond.Wait()
		}
		if p.rdone {
			// Nobody reads: drop the rest rather than stall the exec.
			return n + len(b), nil
		}
		k := min(len(b), p.cap-len(p.buf))
		p.buf = append(p.buf, b[:k]...)
		b = b[k:]
		n += k
		p.cond.Broadcast()
	}
	return n, nil
}

// DropWrites makes later writes (and one blocked now) discard their data;
// what is buffered can still be read.
func (p *Pipe) DropWrites() {
	p.mu.Lock()
	p.rdone = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

// CloseWrite ends the data: a Read of an empty pipe returns io.EOF.
func (p *Pipe) CloseWrite() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

type reader struct{ p *Pipe }

func (r reader) Read(b []byte) (int, error) {
	p := r.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.buf) == 0 && !p.closed {
		p.cond.Wait()
	}
	if len(p.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(b, p.buf)
	p.buf = p.buf[n:]
	if len(p.buf) == 0 {
		p.buf = nil
	}
	p.cond.Broadcast()
	return n, nil
}

// Close stops reading; later output is discarded.
func (r reader) Close() error {
	r.p.DropWrites()
	return nil
}
