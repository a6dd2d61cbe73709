//go:build linux

package guestinit

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/guestabi"
)

// maxSecret bounds one secret line, in bytes (longer lines are dropped).
const maxSecret = 256

// Secret is the box secret the agent checks host proofs against
// (transport.GuestKey). The host writes it on the guestabi.SecretPort port
// at boot, and a new one whenever it restores the box from a snapshot
// (the snapshot's memory holds the old one): each line replaces the last.
// Until the first line arrives the secret is a random value nobody knows,
// so no host is served unauthenticated while it is late.
type Secret struct {
	mu      sync.Mutex
	cur     []byte
	changed chan struct{}
}

// Current returns the secret and a channel closed when it is replaced.
func (s *Secret) Current() ([]byte, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.changed
}

func (s *Secret) set(v []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = v
	close(s.changed)
	s.changed = make(chan struct{})
}

// WatchSecret finds the secret port (waiting up to d for it) and reads
// secrets from it for as long as the agent runs; it waits up to another
// 5 s for the first. A guest without the port (a host that sends no
// secret) gets an error, and then serves hosts without proof.
func WatchSecret(d time.Duration) (*Secret, error) {
	devs, err := FindPorts(guestabi.SecretPort, 1, d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(devs[0])
	if err != nil {
		return nil, err
	}
	placeholder := make([]byte, 32)
	rand.Read(placeholder)
	s := &Secret{cur: []byte(hex.EncodeToString(placeholder)), changed: make(chan struct{})}
	first := make(chan struct{})
	go func() {
		defer f.Close()
		r := bufio.NewReaderSize(f, maxSecret+1)
		once := sync.Once{}
		for {
			line, err := r.ReadSlice('\n')
			if err == bufio.ErrBufferFull {
				// Too long: drop the rest of the line.
				for err == bufio.ErrBufferFull {
					_, err = r.ReadSlice('\n')
				}
				continue
			}
			if err != nil {
				// EOF (the host side went away, as across a snapshot
				// restore) or an error: look again soon.
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if v := strings.TrimSpace(string(line)); v != "" {
				s.set([]byte(v))
				once.Do(func() { close(first) })
			}
		}
	}()
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		Logf("no box secret on %s after 5 s: refusing hosts until it arrives", devs[0])
	}
	return s, nil
}
