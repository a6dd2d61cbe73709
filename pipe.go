package airlock

import (
	"io"
	"sync"
)

// boundedPipe is an in-memory pipe holding at most cap bytes: Write blocks
// while it is full, Read blocks while it is empty. It decouples stdout from
// stderr (a full stderr does not stop stdout until its own buffer is full)
// while keeping memory bounded.
type boundedPipe struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	cap    int
	closed bool // write side closed
	rdone  bool // read side closed
}

func newBoundedPipe(capacity int) (io.Reader, *boundedPipe) {
	p := &boundedPipe{cap: capacity}
	p.cond = sync.NewCond(&p.mu)
	return pipeReader{p}, p
}

func (p *boundedPipe) Write(b []byte) (int, error) {
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

// dropWrites makes later writes (and one blocked now) discard their data;
// what is buffered can still be read.
func (p *boundedPipe) dropWrites() {
	p.mu.Lock()
	p.rdone = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *boundedPipe) CloseWrite() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

type pipeReader struct{ p *boundedPipe }

func (r pipeReader) Read(b []byte) (int, error) {
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
func (r pipeReader) Close() error {
	r.p.dropWrites()
	return nil
}
