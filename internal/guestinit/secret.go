//go:build linux

package guestinit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/airlock-run/airlock/internal/guestabi"
)

// maxSecret bounds what ReadSecret accepts, in bytes.
const maxSecret = 256

// ReadSecret reads the box secret from the guestabi.SecretPort port: the line the
// host sent (up to maxSecret bytes), trimmed of white space. It waits up to
// d for the port; a guest without it (a host that sends no secret) gets
// an error, and then serves hosts without proof.
func ReadSecret(d time.Duration) ([]byte, error) {
	devs, err := FindPorts(guestabi.SecretPort, 1, d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(devs[0])
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type res struct {
		b   []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		var buf []byte
		b := make([]byte, maxSecret)
		for len(buf) < maxSecret {
			n, err := f.Read(b[:maxSecret-len(buf)])
			buf = append(buf, b[:n]...)
			if err == io.EOF || (err == nil && n == 0) || bytes.IndexByte(buf, '\n') >= 0 {
				break
			}
			if err != nil {
				ch <- res{err: err}
				return
			}
		}
		ch <- res{b: buf}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		s := strings.TrimSpace(string(r.b))
		if s == "" {
			return nil, errors.New("the secret port was empty")
		}
		return []byte(s), nil
	case <-time.After(5 * time.Second):
		return nil, fmt.Errorf("no secret on %s after 5 s", devs[0])
	}
}
