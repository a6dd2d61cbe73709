package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
)

// Bounds on what a registry (or an image archive) may make the host hold.
const (
	// MaxManifestBytes bounds a manifest or index, and every other registry
	// response but a blob (token, error and ping bodies): 4 MiB, the size
	// the OCI distribution spec asks registries to accept.
	MaxManifestBytes = 4 << 20
	// MaxConfigBytes bounds an image config blob (held in memory): 16 MiB.
	MaxConfigBytes = 16 << 20
	// MaxLayers bounds the layers of one image.
	MaxLayers = 512
	// DefaultMaxImageBytes is the default bound on an image's declared
	// size (config and layers, compressed as stored): 64 GiB.
	DefaultMaxImageBytes = 64 << 30
	// DefaultStallTimeout is how long a registry may send (almost) nothing
	// before a pull gives up on it: 30 s.
	DefaultStallTimeout = 30 * time.Second
	// stallBytes is what a registry must send per stall timeout to count
	// as sending: a trickle of a few bytes a second holds no pull (and the
	// store's gc lock) for ever.
	stallBytes = 1 << 10
)

// ErrTooLarge is wrapped by errors for images, manifests and registry
// responses past airlock's bounds (MaxManifestBytes, MaxConfigBytes,
// MaxLayers, PullOptions.MaxBytes, the store's free space).
var ErrTooLarge = errors.New("image is too large")

// ErrStalled is wrapped by Pull errors when the registry stopped sending
// (nothing, or under 1 KiB, for PullOptions.StallTimeout).
var ErrStalled = errors.New("registry stalled")

// ErrAddressRefused is wrapped by Pull errors when PullOptions.CheckAddr
// refused an address the pull was to connect to.
var ErrAddressRefused = errors.New("address refused")

// RefusedError is a connection PullOptions.CheckAddr refused: to Host
// (as the registry, a redirect or the token realm named it), resolved to
// Addr. Err is the check's error.
type RefusedError struct {
	Host string
	Addr netip.Addr
	Err  error
}

func (e *RefusedError) Error() string {
	if e.Host == e.Addr.String() {
		return fmt.Sprintf("connecting to %s is not allowed: %v", e.Host, e.Err)
	}
	return fmt.Sprintf("connecting to %s (%s) is not allowed: %v", e.Host, e.Addr, e.Err)
}

// Unwrap returns the check's error and ErrAddressRefused.
func (e *RefusedError) Unwrap() []error { return []error{e.Err, ErrAddressRefused} }

// checkedDialer returns a DialContext that asks check about every address
// it connects to, after name resolution and before connecting, so a name
// that resolves to an address the check refuses (DNS rebinding included)
// is never connected to.
func checkedDialer(base *net.Dialer, check func(host string, addr netip.Addr) error) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		d := *base
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("connecting to %s: unexpected address %q", host, address)
			}
			if err := check(host, ap.Addr().Unmap()); err != nil {
				return &RefusedError{Host: host, Addr: ap.Addr().Unmap(), Err: err}
			}
			return nil
		}
		return d.DialContext(ctx, network, addr)
	}
}

// guardTransport bounds what a registry can make a pull hold: every
// response but a blob's is cut at MaxManifestBytes, and a response whose
// headers do not come, or whose body sends under stallBytes, within stall
// ends the request with an error wrapping ErrStalled.
type guardTransport struct {
	inner    http.RoundTripper
	registry string
	stall    time.Duration
}

// origin returns the request a chain of redirects started from.
func origin(req *http.Request) *http.Request {
	for req.Response != nil && req.Response.Request != nil {
		req = req.Response.Request
	}
	return req
}

// what names what a request fetches, for errors: "blob sha256:...",
// "manifest latest", or its path.
func what(req *http.Request) (string, bool) {
	p := origin(req).URL.Path
	i := strings.LastIndex(p, "/")
	last := p[i+1:]
	switch {
	case strings.Contains(p, "/blobs/"):
		return "blob " + last, true
	case strings.Contains(p, "/manifests/"):
		return "manifest " + last, false
	}
	return req.URL.Host + p, false
}

func (g *guardTransport) stalled(req *http.Request, phase string) error {
	w, _ := what(req)
	from := ""
	if req.URL.Host != g.registry {
		from = " (from " + req.URL.Host + ")"
	}
	return fmt.Errorf("registry %s %s for %s while sending %s%s: check the network or the registry, and pull again: %w",
		g.registry, phase, g.stall, w, from, ErrStalled)
}

func (g *guardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	timer := time.AfterFunc(g.stall, func() { cancel(g.stalled(req, "sent no response")) })
	resp, err := g.inner.RoundTrip(req.WithContext(ctx))
	if !timer.Stop() || err != nil {
		if err == nil {
			resp.Body.Close()
		}
		cause := context.Cause(ctx)
		cancel(nil)
		if errors.Is(cause, ErrStalled) {
			return nil, cause
		}
		return nil, err
	}
	w, blob := what(req)
	limit := int64(-1)
	if !blob {
		limit = MaxManifestBytes
	}
	b := &guardBody{rc: resp.Body, ctx: ctx, cancel: cancel, stall: g.stall, limit: limit, what: w, registry: g.registry}
	b.timer = time.AfterFunc(g.stall, func() { cancel(g.stalled(req, fmt.Sprintf("sent under %d bytes", stallBytes))) })
	resp.Body = b
	return resp, nil
}

// guardBody is a response body under guardTransport's bounds.
type guardBody struct {
	rc       io.ReadCloser
	ctx      context.Context
	cancel   context.CancelCauseFunc
	timer    *time.Timer
	stall    time.Duration
	limit    int64 // -1: none
	n, since int64
	what     string
	registry string
}

func (b *guardBody) Read(p []byte) (int, error) {
	if b.limit >= 0 && b.n > b.limit {
		return 0, b.tooLarge()
	}
	k, err := b.rc.Read(p)
	b.n += int64(k)
	b.since += int64(k)
	if b.since >= stallBytes {
		b.since = 0
		b.timer.Reset(b.stall)
	}
	if b.limit >= 0 && b.n > b.limit {
		b.cancel(nil)
		return 0, b.tooLarge()
	}
	if err == io.EOF {
		b.timer.Stop()
	} else if err != nil {
		if cause := context.Cause(b.ctx); errors.Is(cause, ErrStalled) {
			err = cause
		}
	}
	return k, err
}

func (b *guardBody) tooLarge() error {
	return fmt.Errorf("registry %s sent more than %s for %s, the most airlock reads for one: %w",
		b.registry, humanize.IBytes(uint64(b.limit)), b.what, ErrTooLarge)
}

func (b *guardBody) Close() error {
	b.timer.Stop()
	err := b.rc.Close()
	b.cancel(nil)
	return err
}
