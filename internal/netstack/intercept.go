package netstack

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-run/airlock/internal/defaults"
)

// ExtraCAEnv names the PEM file of CA certificates the helper trusts
// besides the host's roots when it verifies an intercepted connection's
// real host (see defaults.ExtraCAEnv).
const ExtraCAEnv = defaults.ExtraCAEnv

// Bounds of the interception.
const (
	// helloTimeout bounds how long the box may take to send its TLS
	// ClientHello, and the handshakes on either side.
	helloTimeout = 15 * time.Second
	// maxHello bounds the bytes read while waiting for the ClientHello.
	maxHello = 64 << 10
	// maxLeaves bounds the leaf certificates kept (one per host name).
	maxLeaves = 1024
	// maxHeaderBytes bounds a request's headers from the box.
	maxHeaderBytes = 1 << 20
	// upstreamConns bounds the connections to the real host per
	// intercepted box connection (HTTP/1.1 reconnects after a close).
	upstreamConns = 4
)

// interceptor terminates the box's TLS connections to the hosts its
// secrets are bound to, with certificates of the box's CA, and forwards
// their HTTP requests to the real host over TLS verified against roots,
// with the secrets' placeholders replaced by their values in the request
// headers.
type interceptor struct {
	e *Engine
	// secrets are replaced whole when a value changes (setValue).
	secrets atomic.Pointer[[]Secret]
	ca      *x509.Certificate
	caKey   *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey
	roots   *x509.CertPool
	// dial connects to the real host (dialTCP; tests replace it).
	dial func(netip.AddrPort) (net.Conn, error)

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// newInterceptor returns the interceptor of sc, verifying real hosts
// against the host's roots and the certificates of the PEM file extraCA
// ("": none). It reads the roots now (the helper chroots later).
func newInterceptor(e *Engine, sc SecretConfig, extraCA string) (*interceptor, error) {
	if err := CheckSecrets(sc.Secrets); err != nil {
		return nil, err
	}
	ca, caKey, err := parseCA(sc.CACert, sc.CAKey)
	if err != nil {
		return nil, err
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if extraCA != "" {
		pemBytes, err := os.ReadFile(extraCA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ExtraCAEnv, err)
		}
		if !roots.AppendCertsFromPEM(pemBytes) {
			return nil, fmt.Errorf("%s=%s: no PEM certificate in it", ExtraCAEnv, extraCA)
		}
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ic := &interceptor{e: e, ca: ca, caKey: caKey, leafKey: leafKey, roots: roots,
		dial: dialTCP, leaves: map[string]*tls.Certificate{}}
	ss := slices.Clone(sc.Secrets)
	ic.secrets.Store(&ss)
	return ic, nil
}

// setValue changes the value of the secret name: requests forwarded from
// now on carry the new one.
func (ic *interceptor) setValue(name, value string) error {
	if err := CheckSecretValue(name, value); err != nil {
		return err
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	ss := slices.Clone(*ic.secrets.Load())
	for i := range ss {
		if ss[i].Name == name {
			ss[i].Value = value
			ic.secrets.Store(&ss)
			return nil
		}
	}
	return fmt.Errorf("the box has no secret %s", name)
}

// bound reports whether a secret is bound to name (lower case, no final
// dot).
func (ic *interceptor) bound(name string) bool {
	for _, s := range *ic.secrets.Load() {
		for _, h := range s.Hosts {
			if MatchSecretHost(h, name) {
				return true
			}
		}
	}
	return false
}

// secretsFor returns the secrets bound to name.
func (ic *interceptor) secretsFor(name string) []Secret {
	var out []Secret
	for _, s := range *ic.secrets.Load() {
		for _, h := range s.Hosts {
			if MatchSecretHost(h, name) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// leaf returns a certificate for name signed by the box's CA (cached,
// made again when it nears its end).
func (ic *interceptor) leaf(name string) (*tls.Certificate, error) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if c := ic.leaves[name]; c != nil && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ic.ca, &ic.leafKey.PublicKey, ic.caKey)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ic.ca.Raw}, PrivateKey: ic.leafKey, Leaf: cert}
	if len(ic.leaves) >= maxLeaves {
		clear(ic.leaves)
	}
	ic.leaves[name] = c
	return c, nil
}

// clientHello is what the box's ClientHello says.
type clientHello struct {
	serverName string
	protos     []string
}

var errPeeked = errors.New("client hello read")

// peekHello reads the box's ClientHello from c, and returns it with the
// bytes read (to replay to whichever end takes the connection).
func peekHello(c net.Conn) (clientHello, []byte, error) {
	rc := &recordConn{Conn: c}
	var h clientHello
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	defer c.SetReadDeadline(time.Time{})
	err := tls.Server(rc, &tls.Config{GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		h = clientHello{serverName: strings.TrimSuffix(strings.ToLower(chi.ServerName), "."), protos: slices.Clone(chi.SupportedProtos)}
		return nil, errPeeked
	}}).Handshake()
	if !errors.Is(err, errPeeked) {
		if err == nil {
			err = errors.New("no ClientHello")
		}
		return clientHello{}, rc.buf.Bytes(), err
	}
	return h, rc.buf.Bytes(), nil
}

// recordConn keeps what is read through it (up to maxHello) and drops
// what is written (the TLS alert of an aborted peek).
type recordConn struct {
	net.Conn
	buf bytes.Buffer
}

func (c *recordConn) Read(p []byte) (int, error) {
	if c.buf.Len() >= maxHello {
		return 0, errors.New("ClientHello too large")
	}
	n, err := c.Conn.Read(p[:min(len(p), maxHello-c.buf.Len())])
	c.buf.Write(p[:n])
	return n, err
}

func (c *recordConn) Write(p []byte) (int, error) { return len(p), nil }

// replayConn reads r (the bytes peeked) before the connection's own.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func newReplayConn(c net.Conn, peeked []byte) *replayConn {
	return &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(peeked), c)}
}

// handle serves the box's connection in to an address that names resolved
// to (names: those of them a secret is bound to); out is the
// connection to the real host, dialed at dial. A connection whose
// ClientHello names none of names is relayed as is; one that does is
// intercepted. It returns when the connection ends.
func (ic *interceptor) handle(in, out net.Conn, dial netip.AddrPort, names []string) {
	h, peeked, err := peekHello(in)
	if err != nil || !slices.Contains(names, h.serverName) {
		// Not TLS, or not to a bound name: the box talks to the real
		// host (and sees its certificate).
		if len(peeked) > 0 {
			if _, err := out.Write(peeked); err != nil {
				in.Close()
				out.Close()
				return
			}
			ic.e.bytesOut.Add(uint64(len(peeked)))
		}
		relayTCP(in, out, &ic.e.bytesOut, &ic.e.bytesIn)
		return
	}
	name := h.serverName
	var protos []string
	for _, p := range h.protos {
		if p == "h2" || p == "http/1.1" {
			protos = append(protos, p)
		}
	}
	upCfg := &tls.Config{ServerName: name, RootCAs: ic.roots, NextProtos: protos, MinVersion: tls.VersionTLS12}
	up := tls.Client(out, upCfg)
	hctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	err = up.HandshakeContext(hctx)
	cancel()
	if err != nil {
		// No silent downgrade: the box's handshake fails too.
		ic.e.Deny("tls", name, "real host not verified: "+shortTLSError(err))
		in.Close()
		out.Close()
		return
	}
	boxProtos := []string{"http/1.1"}
	if p := up.ConnectionState().NegotiatedProtocol; p != "" {
		boxProtos = []string{p}
	}
	tc := tls.Server(newReplayConn(&countConn{Conn: in, in: &ic.e.bytesOut, out: &ic.e.bytesIn}, peeked), &tls.Config{
		NextProtos: boxProtos,
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return ic.leaf(name)
		},
	})
	hctx, cancel = context.WithTimeout(context.Background(), helloTimeout)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		in.Close()
		up.Close()
		return
	}
	ic.serveHTTP(tc, up, name, dial)
}

// shortTLSError is err's message without Go's prefixes.
func shortTLSError(err error) string {
	var ce *tls.CertificateVerificationError
	if errors.As(err, &ce) {
		return ce.Err.Error()
	}
	return err.Error()
}

// serveHTTP serves the HTTP requests of the box's intercepted connection
// tc, forwarding each to name's real host: first over up (already
// verified), then over new connections to dial.
func (ic *interceptor) serveHTTP(tc *tls.Conn, up *tls.Conn, name string, dial netip.AddrPort) {
	var first atomic.Pointer[tls.Conn]
	first.Store(up)
	// Later connections speak what the first one does.
	var upProtos []string
	if p := up.ConnectionState().NegotiatedProtocol; p != "" {
		upProtos = []string{p}
	}
	tr := &http.Transport{
		Proxy: nil,
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if c := first.Swap(nil); c != nil {
				return c, nil
			}
			raw, err := ic.dial(dial)
			if err != nil {
				return nil, err
			}
			c := tls.Client(raw, &tls.Config{ServerName: name, RootCAs: ic.roots, NextProtos: upProtos, MinVersion: tls.VersionTLS12})
			hctx, cancel := context.WithTimeout(ctx, helloTimeout)
			defer cancel()
			if err := c.HandshakeContext(hctx); err != nil {
				raw.Close()
				return nil, err
			}
			return c, nil
		},
		ForceAttemptHTTP2:   true,
		DisableCompression:  true,
		MaxConnsPerHost:     upstreamConns,
		MaxIdleConnsPerHost: upstreamConns,
		IdleConnTimeout:     90 * time.Second,
	}
	defer func() {
		if c := first.Swap(nil); c != nil {
			c.Close()
		}
		tr.CloseIdleConnections()
	}()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = name
			if pr.Out.Host == "" {
				pr.Out.Host = name
			}
			for _, s := range substitute(pr.Out.Header, ic.secretsFor(name)) {
				ic.e.Note("https " + name + " secret " + s + " substituted")
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(r.Context().Err(), context.Canceled) {
				return
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, "airlock: %s: %s\n", name, shortTLSError(err))
		},
	}
	done := make(chan struct{})
	var once sync.Once
	srv := &http.Server{
		Handler:           rp,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				once.Do(func() { close(done) })
			}
		},
	}
	srv.Serve(&oneConnListener{c: tc, done: done})
}

// substitute replaces the placeholders of secrets in h's values by the
// secrets' values, and returns the names of those it replaced.
func substitute(h http.Header, secrets []Secret) []string {
	var used []string
	for _, vs := range h {
		for i, v := range vs {
			for _, s := range secrets {
				if strings.Contains(v, s.Placeholder) {
					v = strings.ReplaceAll(v, s.Placeholder, s.Value)
					if !slices.Contains(used, s.Name) {
						used = append(used, s.Name)
					}
				}
			}
			vs[i] = v
		}
	}
	slices.Sort(used)
	return used
}

// oneConnListener is a listener of one connection: Accept returns it,
// then blocks until done is closed.
type oneConnListener struct {
	c    net.Conn
	done chan struct{}
	used bool
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.used {
		l.used = true
		return l.c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

// countConn counts the bytes read (in) and written (out) through it.
type countConn struct {
	net.Conn
	in, out *atomic.Uint64
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(uint64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.Add(uint64(n))
	return n, err
}
