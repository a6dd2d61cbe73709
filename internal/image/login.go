package image

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// LoginTimeout bounds CheckLogin: the ping, a token exchange and the
// authenticated /v2/ request together.
const LoginTimeout = 60 * time.Second

// DockerHubAuthKey is the key Docker's config.json keeps Docker Hub's
// credentials under (historical; what 'docker login' and the pull's
// keychain use).
const DockerHubAuthKey = authn.DefaultAuthKey

// RegistryAuthKey returns the key of registry's credentials in Docker's
// config.json: "https://index.docker.io/v1/" for Docker Hub (docker.io,
// index.docker.io, registry-1.docker.io), else the host[:port] the
// registry was named by, without a scheme or path ("https://ghcr.io/" →
// "ghcr.io"). Errors: a name that is not a registry's.
func RegistryAuthKey(registry string) (string, error) {
	s := strings.TrimSpace(registry)
	if s == DockerHubAuthKey {
		return DockerHubAuthKey, nil
	}
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	s, _, _ = strings.Cut(s, "/")
	if s == "" {
		return "", fmt.Errorf("no registry named in %q: want a host such as ghcr.io or localhost:5000", registry)
	}
	reg, err := name.NewRegistry(s, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("%q is not a registry name: want a host such as ghcr.io or localhost:5000", registry)
	}
	if r := reg.RegistryStr(); r == name.DefaultRegistry || r == DockerHub || r == "registry-1.docker.io" {
		return DockerHubAuthKey, nil
	}
	return reg.RegistryStr(), nil
}

// CheckLogin checks username and password against registry (a key of
// RegistryAuthKey) as 'docker login' does: it asks the registry's /v2/
// for its challenge, answers it (basic auth, or a token from the realm
// the challenge names, fetched with the credentials) and asks /v2/
// again with them. Plain HTTP is used for a loopback registry, or with
// insecure. It sends nothing to any other host than the registry and the
// token realm its challenge names, and takes at most LoginTimeout.
//
// Errors wrap ErrUnauthorized (the registry refused the credentials: the
// text names it and its HTTP status) or ErrUnreachable.
func CheckLogin(ctx context.Context, registry, username, password string, insecure bool) error {
	host := registry
	if host == DockerHubAuthKey {
		host = name.DefaultRegistry
	}
	var nopts []name.Option
	if insecure || isLoopback(host) {
		nopts = append(nopts, name.Insecure)
	}
	reg, err := name.NewRegistry(host, nopts...)
	if err != nil {
		return fmt.Errorf("%q is not a registry name: %w", registry, err)
	}
	shown := registryString(reg)
	ctx, cancel := context.WithTimeout(ctx, LoginTimeout)
	defer cancel()
	auth := authn.FromConfig(authn.AuthConfig{Username: username, Password: password})
	var inner http.RoundTripper = remote.DefaultTransport
	if t, ok := remote.DefaultTransport.(*http.Transport); ok && insecure {
		t = t.Clone()
		if t.TLSClientConfig == nil {
			t.TLSClientConfig = &tls.Config{}
		}
		t.TLSClientConfig.InsecureSkipVerify = true
		inner = t
	}
	base := &guardTransport{inner: inner, registry: reg.RegistryStr(), stall: DefaultStallTimeout}
	rt, err := transport.NewWithContext(ctx, reg, auth, base, nil)
	if err != nil {
		return loginError(shown, err)
	}
	// As the ping: https first, then plain HTTP where it is allowed.
	schemes := []string{"https"}
	if reg.Scheme() == "http" {
		schemes = append(schemes, "http")
	}
	var resp *http.Response
	for i, scheme := range schemes {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+reg.RegistryStr()+"/v2/", nil)
		if err != nil {
			return err
		}
		resp, err = (&http.Client{Transport: rt}).Do(req)
		if err == nil {
			break
		}
		if i == len(schemes)-1 || ctx.Err() != nil {
			return loginError(shown, err)
		}
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("%s refused the user name or password (HTTP %d): check them (some registries want an access token as the password): %w",
			shown, resp.StatusCode, ErrUnauthorized)
	}
	return fmt.Errorf("%s answered HTTP %d to /v2/: is it a container registry?", shown, resp.StatusCode)
}

// loginError says what a failed ping or token exchange means.
func loginError(reg string, err error) error {
	var terr *transport.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s did not answer within %s: %w", reg, LoginTimeout, ErrUnreachable)
	case errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &terr) && (terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden ||
		hasCode(terr, transport.UnauthorizedErrorCode, transport.DeniedErrorCode)):
		return fmt.Errorf("%s refused the user name or password (%s): check them (some registries want an access token as the password): %w",
			reg, statusText(terr), ErrUnauthorized)
	case errors.As(err, &terr):
		return fmt.Errorf("%s answered %s: is it a container registry?", reg, statusText(terr))
	case isNetError(err):
		return fmt.Errorf("%s is unreachable (%s): %w", reg, shortNetError(err), ErrUnreachable)
	}
	return fmt.Errorf("log in to %s: %w", reg, err)
}

// loginName is how a pull error names reg for 'airlock login REG'.
func loginName(reg string) string {
	if reg == DockerHub {
		return "docker.io"
	}
	return reg
}
