package lifecycle

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/netstack/helper"
)

// Ports is the published TCP ports that a runtime holds open for its
// IdleSuspend boxes (helper.Held), by box id, and the watch for a
// connection while such a box is suspended. Safe for concurrent use; the
// zero value holds none.
type Ports struct {
	mu   sync.Mutex
	held map[string]*held
}

// held is one box's ports and their watch (cancel and waited are nil
// when none runs).
type held struct {
	ports   *helper.Held
	cancel  context.CancelFunc
	waited  chan struct{}     // closed when the watch's WaitConn has returned
	handoff *net.UnixListener // the watch's hand-over socket, nil when none
}

// HandOverSock is the name, in a box's directory, of the socket on which
// the runtime that holds a suspended box's ports (its watch) hands them
// over to another process that resumes the box (airlock exec while
// airlock serve holds them): that one's helper then accepts on them, and
// binding them again is not needed (it would fail: address in use).
const HandOverSock = "ports-handover.sock"

// Hold returns the ports held for box id for its network helper to
// inherit, ending their watch (the box is starting); else it binds pub
// now and holds them from then on, so that they stay bound when the box
// is suspended. nil when pub has no TCP port.
// Ports another process holds for the box (its watch, in dir) are taken
// from it (HandOverSock) rather than bound.
func (p *Ports) Hold(id, dir string, pub []netstack.Publish) (*helper.Held, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if hb := p.held[id]; hb != nil {
		hb.stopWatch()
		return hb.ports, nil
	}
	if h := takeOver(dir); h != nil {
		p.add(id, h)
		return h, nil
	}
	h, err := helper.Bind(pub)
	if err != nil || h == nil {
		return nil, err
	}
	p.add(id, h)
	return h, nil
}

// add holds h for box id. Preconditions: p.mu is held.
func (p *Ports) add(id string, h *helper.Held) *held {
	if p.held == nil {
		p.held = map[string]*held{}
	}
	hb := &held{ports: h}
	p.held[id] = hb
	return hb
}

// takeOver asks the process that watches the box of directory dir for
// its ports (HandOverSock); nil when none answers within a few seconds.
func takeOver(dir string) *helper.Held {
	if dir == "" {
		return nil
	}
	c, err := net.DialTimeout("unix", filepath.Join(dir, HandOverSock), 2*time.Second)
	if err != nil {
		return nil
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	h, err := helper.Receive(c.(*net.UnixConn))
	if err != nil {
		return nil
	}
	return h
}

// serveHandOver hands box id's ports (hb) over to the first process that
// asks on l (takeOver), and stops holding them here: that process starts
// the box. It returns when l is closed (the watch ended).
func (p *Ports) serveHandOver(id string, hb *held, l *net.UnixListener) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.held[id] != hb {
			p.mu.Unlock()
			c.Close()
			return
		}
		hb.stopWatch()
		delete(p.held, id)
		p.mu.Unlock()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		hb.ports.Send(c)
		c.Close()
		hb.ports.Close()
		return
	}
}

// stopWatch ends hb's watch, if one runs, and waits for it; it closes
// the hand-over socket.
func (hb *held) stopWatch() {
	if hb.handoff != nil {
		hb.handoff.Close() // removes the socket file
		hb.handoff = nil
	}
	if hb.cancel != nil {
		hb.cancel()
		<-hb.waited
		hb.cancel, hb.waited = nil, nil
	}
}

// Release closes the ports held for box id, if any (its stop or removal:
// they are free again).
func (p *Ports) Release(id string) {
	p.mu.Lock()
	hb := p.held[id]
	delete(p.held, id)
	if hb != nil {
		hb.stopWatch()
	}
	p.mu.Unlock()
	if hb != nil {
		hb.ports.Close()
	}
}

// ReleaseStale releases the ports held for boxes that are neither
// running nor suspended (stopped, removed or died, maybe by another
// process), live being the ids of those that are, unless a start holds
// the box's lock (dirOf gives a box's directory); nil live releases
// every one.
func (p *Ports) ReleaseStale(live map[string]bool, dirOf func(id string) string) {
	p.mu.Lock()
	var stale []string
	for id := range p.held {
		if !live[id] {
			stale = append(stale, id)
		}
	}
	p.mu.Unlock()
	for _, id := range stale {
		dir := dirOf(id)
		if _, err := os.Stat(dir); live != nil && err == nil {
			// A box that still exists may be starting: a start holds its
			// lock for the whole start (long past this wait), and then
			// decides. A removed box has no lock to ask.
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			unlock, err := boxdir.LockBox(ctx, dir)
			cancel()
			if err != nil && ctx.Err() != nil {
				continue // locked: a start (or stop) in progress decides
			}
			if unlock != nil {
				unlock()
			}
		}
		p.Release(id)
	}
}

// Watch keeps the published TCP ports of box id, just suspended, bound
// (those held since its start, else pub bound now: a box another process
// started), and calls wake once, from a goroutine of its own, on the
// first connection to one: the connection stays queued for the box's new
// helper. It returns Bind's error when the ports could not be bound; a
// box whose ports are watched already, or that publishes no TCP port, is
// left as it is.
//
// While it watches, another process that resumes the box takes the ports
// over (HandOverSock in dir, the box's directory).
func (p *Ports) Watch(id, dir string, pub []netstack.Publish, wake func()) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	hb := p.held[id]
	if hb == nil {
		h, err := helper.Bind(pub)
		if err != nil {
			return err
		}
		if h == nil {
			return nil
		}
		hb = p.add(id, h)
	}
	if hb.cancel != nil {
		return nil // watched already
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan struct{})
	hb.cancel, hb.waited = cancel, waited
	if dir != "" {
		sock := filepath.Join(dir, HandOverSock)
		os.Remove(sock)
		if l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"}); err == nil {
			hb.handoff = l
			go p.serveHandOver(id, hb, l)
		}
	}
	go func() {
		err := hb.ports.WaitConn(ctx)
		close(waited)
		if err != nil {
			return // the box was started, stopped or removed
		}
		p.mu.Lock()
		if hb.waited == waited {
			hb.cancel, hb.waited = nil, nil
		}
		p.mu.Unlock()
		cancel()
		wake()
	}()
	return nil
}

// Wakes is the resumes in progress of boxes, by id, so that concurrent
// callers resume a box once. The zero value is ready.
type Wakes struct {
	mu sync.Mutex
	m  map[string]*waking
}

// waking is a resume in progress: done is closed once err is set.
type waking struct {
	done chan struct{}
	err  error
}

// Do runs resume for box id, unless a resume of it is in progress: then
// it waits for that one's outcome (or ctx's end: ctx's error). resume
// runs to its end whatever ctx does, as others may wait for it.
func (w *Wakes) Do(ctx context.Context, id string, resume func() error) error {
	w.mu.Lock()
	if wk, ok := w.m[id]; ok {
		w.mu.Unlock()
		select {
		case <-wk.done:
			return wk.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	wk := &waking{done: make(chan struct{})}
	if w.m == nil {
		w.m = map[string]*waking{}
	}
	w.m[id] = wk
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.m, id)
		w.mu.Unlock()
		close(wk.done)
	}()
	wk.err = resume()
	return wk.err
}
