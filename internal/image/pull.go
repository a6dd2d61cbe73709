package image

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

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
}

// Pull fetches ref ("python:slim", "ghcr.io/o/r:tag", "name@sha256:...")
// from its registry into the store and names it by its normalized reference,
// with Source "pulled from REF". A multi-platform index resolves to its
// linux/amd64 image. Blobs already in the store are not downloaded again, so
// pulling a present image costs only the manifest requests. Every blob is
// verified against its digest before it is kept.
//
// Errors wrap ErrNotFound (no such image or tag in the registry),
// ErrUnauthorized, ErrUnreachable, ErrNoPlatform or ErrDigestMismatch and
// say what to do about it. Cancelling ctx stops the transfer.
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
		if base, ok := remote.DefaultTransport.(*http.Transport); ok && opts.Insecure {
			t := base.Clone()
			if t.TLSClientConfig == nil {
				t.TLSClientConfig = &tls.Config{}
			}
			t.TLSClientConfig.InsecureSkipVerify = true
			tr = t
		}
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
		if m, err := img.Manifest(); err == nil && !s.hasBlob(m.Config.Digest, m.Config.Size) {
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
	md, err := s.storeImage(ctx, img, opts.Progress)
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
func (s *Store) pullError(ref, norm, reg string, err error) error {
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
			return fmt.Errorf("pull %s: %s refused access (HTTP %d): if the image is private, log in with 'docker login %s' (airlock reads ~/.docker/config.json); otherwise check the name: %w: %v",
				norm, reg, terr.StatusCode, reg, ErrUnauthorized, terr)
		}
		if terr.StatusCode == http.StatusNotFound || hasCode(terr, transport.NameUnknownErrorCode, transport.ManifestUnknownErrorCode) {
			return fmt.Errorf("pull %s: %s has no such image or tag: %w: %v", norm, reg, ErrNotFound, terr)
		}
		return fmt.Errorf("pull %s from %s: %w", norm, reg, err)
	}
	if isNetError(err) {
		local := ""
		if img, lerr := s.Resolve(ref); lerr == nil {
			local = fmt.Sprintf(" (a local copy %s, %s, is present and can be used as is)", img.Ref, img.Digest[:19])
			return fmt.Errorf("pull %s: %s is unreachable%s: %w: %v", norm, reg, local, ErrUnreachable, err)
		}
		return fmt.Errorf("image %q not found in the local store %s (see 'airlock images'; AIRLOCK_IMAGES points at another store) and %s is unreachable: pull it where it is reachable and 'airlock import' it, or build one with 'airlock image build-debian': %w: %v",
			ref, s.Dir(), reg, ErrUnreachable, err)
	}
	return fmt.Errorf("pull %s: %w", norm, err)
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
