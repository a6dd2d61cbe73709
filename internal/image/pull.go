package image

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// ErrUnreachable is wrapped by Pull errors when the registry cannot be
// reached (DNS failure, connection refused, TLS or network errors).
var ErrUnreachable = errors.New("registry is unreachable")

// ErrUnauthorized is wrapped by Pull errors when the registry refuses access
// (HTTP 401/403).
var ErrUnauthorized = errors.New("registry refused access")

// ErrNoPlatform is wrapped by Pull errors when a multi-platform image has no
// linux/amd64 variant.
var ErrNoPlatform = errors.New("no linux/amd64 image")

// Platform is the only platform airlock runs: linux/amd64.
var Platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// PullOptions tunes Pull. The zero value is ready to use.
type PullOptions struct {
	// Insecure allows plain HTTP (and unverified TLS) to the registry.
	// Loopback registries (127.0.0.0/8, ::1, localhost) always allow HTTP.
	Insecure bool
	// Keychain supplies credentials; nil means authn.DefaultKeychain
	// (~/.docker/config.json, $DOCKER_CONFIG, credential helpers).
	Keychain authn.Keychain
	// Transport is the HTTP transport; nil means remote.DefaultTransport.
	Transport http.RoundTripper
	// Progress, if not nil, receives per-layer download progress.
	Progress ProgressFunc
	// MaxBytes bounds the image's size as its manifest declares it
	// (config and layers, compressed as stored); 0 means
	// DefaultMaxImageBytes. A larger image, or one larger than the store's
	// free space, is refused before any layer is fetched (ErrTooLarge).
	MaxBytes int64
	// StallTimeout is how long the registry may send nothing (or under
	// 1 KiB) before the pull fails with an error wrapping ErrStalled that
	// names the registry and the blob; 0 means DefaultStallTimeout.
	StallTimeout time.Duration
	// CheckAddr, if not nil, is asked about every address the pull
	// connects to (the registry, each redirect, the token realm), at dial
	// time after name resolution: host is the name as it was to be
	// reached, addr the resolved address. An error refuses the connection
	// and fails the pull with a *RefusedError wrapping it. With CheckAddr
	// the pull connects directly, never through an HTTP proxy (which would
	// connect where the check does not see), and Transport must be nil.
	CheckAddr func(host string, addr netip.Addr) error
}

// Pull fetches ref ("python:slim", "ghcr.io/o/r:tag", "name@sha256:...")
// from its registry into the store and names it by its normalized reference,
// with Source "pulled from REF". A multi-platform index resolves to its
// linux/amd64 image. Blobs already in the store are not downloaded again, so
// pulling a present image costs only the manifest requests. Every blob is
// verified against its digest before it is kept.
//
// What a registry can make the host hold is bounded: manifests and other
// responses but blobs to MaxManifestBytes, the config to MaxConfigBytes,
// MaxLayers layers, each of a declared size, together at most
// PullOptions.MaxBytes and the store's free space (checked before any
// layer is fetched); a registry that stalls fails the pull after
// PullOptions.StallTimeout; at most 3 layers download at once. A
// registry's response bodies never appear in errors.
//
// Errors wrap ErrNotFound (no such image or tag in the registry),
// ErrUnauthorized, ErrUnreachable, ErrNoPlatform, ErrDigestMismatch,
// ErrTooLarge, ErrStalled or ErrAddressRefused and say what to do about
// it. Cancelling ctx stops the transfer.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (*Image, error) {
	r, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	norm := refString(r)
	reg := r.Context().RegistryStr()
	var nopts []name.Option
	if opts.Insecure || isLoopback(reg) {
		nopts = append(nopts, name.Insecure)
	}
	gref, err := name.ParseReference(r.String(), nopts...)
	if err != nil {
		return nil, fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	kc := opts.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	tr := opts.Transport
	if tr == nil {
		tr = remote.DefaultTransport
		base, ok := remote.DefaultTransport.(*http.Transport)
		if !ok {
			base = http.DefaultTransport.(*http.Transport)
		}
		if opts.Insecure || opts.CheckAddr != nil {
			t := base.Clone()
			if opts.Insecure {
				if t.TLSClientConfig == nil {
					t.TLSClientConfig = &tls.Config{}
				}
				t.TLSClientConfig.InsecureSkipVerify = true
			}
			if opts.CheckAddr != nil {
				t.Proxy = nil
				t.DialContext = checkedDialer(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}, opts.CheckAddr)
			}
			tr = t
		}
	} else if opts.CheckAddr != nil {
		return nil, errors.New("pull: PullOptions.CheckAddr needs the default transport (Transport nil)")
	}
	stall := opts.StallTimeout
	if stall <= 0 {
		stall = DefaultStallTimeout
	}
	tr = &guardTransport{inner: tr, registry: reg, stall: stall}
	maxBytes := opts.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxImageBytes
	}
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(tr),
		remote.WithPlatform(Platform),
		remote.WithUserAgent("airlock"),
	}
	regName := registryString(r.Context().Registry)

	desc, err := remote.Get(gref, ropts...)
	if err != nil {
		return nil, s.pullError(ref, norm, regName, err)
	}
	var img v1.Image
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, s.pullError(ref, norm, regName, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, s.pullError(ref, norm, regName, err)
		}
		var child *v1.Descriptor
		var have []string
		for i, m := range im.Manifests {
			if m.Platform == nil {
				continue
			}
			if m.Platform.OS == Platform.OS && m.Platform.Architecture == Platform.Architecture && m.MediaType.IsImage() {
				child = &im.Manifests[i]
				break
			}
			if m.Platform.OS != "unknown" {
				have = append(have, m.Platform.String())
			}
		}
		if child == nil {
			return nil, fmt.Errorf("image %q has no linux/amd64 variant (it has: %s); airlock runs linux/amd64 guests only: %w", norm, strings.Join(have, ", "), ErrNoPlatform)
		}
		img, err = idx.Image(child.Digest)
		if err != nil {
			return nil, s.pullError(ref, norm, regName, err)
		}
	case desc.MediaType.IsImage():
		img, err = desc.Image()
		if err != nil {
			return nil, s.pullError(ref, norm, regName, err)
		}
		// ConfigName would fetch the config; the manifest names it.
		m, err := img.Manifest()
		if err != nil {
			return nil, s.pullError(ref, norm, regName, err)
		}
		if err := s.checkManifest(m, maxBytes); err != nil {
			return nil, fmt.Errorf("pull %s from %s: %w", norm, regName, err)
		}
		if !s.hasBlob(m.Config.Digest, m.Config.Size) {
			// Only check the platform when we fetch the config anyway.
			if c, err := img.ConfigFile(); err == nil && c.OS != "" && (c.OS != Platform.OS || c.Architecture != Platform.Architecture) {
				return nil, fmt.Errorf("image %q is %s/%s; airlock runs linux/amd64 guests only: %w", norm, c.OS, c.Architecture, ErrNoPlatform)
			}
		}
	default:
		return nil, fmt.Errorf("image %q: unsupported manifest media type %q", norm, desc.MediaType)
	}

	gl := s.gcLock()
	if err := gl.RLock(); err != nil {
		return nil, err
	}
	defer gl.Unlock()
	md, err := s.storeImage(ctx, img, opts.Progress, maxBytes)
	if err != nil {
		if errors.Is(err, ErrDigestMismatch) {
			return nil, fmt.Errorf("pull %s: %w (nothing corrupt was kept; retry, and if it persists the registry or a proxy is serving bad data)", norm, err)
		}
		return nil, s.pullError(ref, norm, regName, err)
	}
	md.Platform = &Platform
	nd, err := s.setName(ctx, norm, *md, "pulled from "+norm)
	if err != nil {
		return nil, err
	}
	return s.describe(norm, nd)
}

// pullError turns a go-containerregistry error into one that says what to do.
//
// A registry's response body never reaches the error (a registry, or a
// host a redirect names, must not be able to show its content through a
// server's errors): only its status and error codes do.
func (s *Store) pullError(ref, norm, reg string, err error) error {
	var refused *RefusedError
	if errors.As(err, &refused) {
		return fmt.Errorf("pull %s from %s: %w", norm, reg, refused)
	}
	if errors.Is(err, ErrStalled) || errors.Is(err, ErrTooLarge) {
		return fmt.Errorf("pull %s: %w", norm, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pull %s: %w", norm, err)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch {
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden ||
			hasCode(terr, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			if hasCode(terr, transport.NameUnknownErrorCode, transport.ManifestUnknownErrorCode) {
				break
			}
			return s.notFoundError(ref, fmt.Sprintf("%s refused access (%s)", reg, statusText(terr)),
				fmt.Sprintf("if the image is private, log in: airlock login %s (or docker login: airlock reads Docker's config.json); otherwise check the name", loginName(reg)), ErrUnauthorized)
		}
		if terr.StatusCode == http.StatusNotFound || hasCode(terr, transport.NameUnknownErrorCode, transport.ManifestUnknownErrorCode) {
			return s.notFoundError(ref, fmt.Sprintf("%s has no such image or tag (%s)", reg, statusText(terr)), "", ErrNotFound)
		}
		return fmt.Errorf("pull %s: %s answered %s", norm, reg, statusText(terr))
	}
	if isNetError(err) {
		local := ""
		if img, lerr := s.Resolve(ref); lerr == nil {
			local = fmt.Sprintf(" (a local copy %s, %s, is present and can be used as is)", img.Ref, img.Digest[:19])
			return fmt.Errorf("pull %s: %s is unreachable%s: %w: %s", norm, reg, local, ErrUnreachable, shortNetError(err))
		}
		return s.notFoundError(ref, fmt.Sprintf("%s is unreachable (%s)", reg, shortNetError(err)),
			"pull it where it is reachable and 'airlock import' it, or build one with 'airlock image build-debian' (AIRLOCK_IMAGES names another store)", ErrUnreachable)
	}
	return fmt.Errorf("pull %s: %w", norm, err)
}

// statusText says what a registry's error response was, from its status
// and error codes only ("HTTP 404, MANIFEST_UNKNOWN"): codes of the
// registry API's form (upper case letters and underscores, short), never
// the body or the registry's messages.
func statusText(e *transport.Error) string {
	out := fmt.Sprintf("HTTP %d", e.StatusCode)
	for i, d := range e.Errors {
		c := string(d.Code)
		if i >= 4 || len(c) > 40 || strings.Trim(c, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") != "" {
			break
		}
		out += ", " + c
	}
	return out
}

func hasCode(e *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range e.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

func isNetError(err error) bool {
	var ne net.Error
	var ue *url.Error
	var oe *net.OpError
	var de *net.DNSError
	return errors.As(err, &oe) || errors.As(err, &de) || errors.As(err, &ue) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || (errors.As(err, &ne) && ne.Timeout())
}

type checkAddrKey struct{}

// WithCheckAddr returns a context under which pulls that take their
// PullOptions.CheckAddr from it (CheckAddrOf) ask check.
func WithCheckAddr(ctx context.Context, check func(host string, addr netip.Addr) error) context.Context {
	return context.WithValue(ctx, checkAddrKey{}, check)
}

// CheckAddrOf is the check WithCheckAddr put in ctx (nil: none).
func CheckAddrOf(ctx context.Context) func(host string, addr netip.Addr) error {
	f, _ := ctx.Value(checkAddrKey{}).(func(string, netip.Addr) error)
	return f
}
