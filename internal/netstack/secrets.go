package netstack

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// Bounds of a box's secrets (see Secret).
const (
	// MaxSecrets is the most secrets a box may have.
	MaxSecrets = 32
	// MaxSecretValue is the longest value of one secret, in bytes.
	MaxSecretValue = 8 << 10
	// MaxSecretHosts is the most hosts one secret may be bound to.
	MaxSecretHosts = 16
)

// PlaceholderPrefix starts every placeholder (see NewPlaceholder).
const PlaceholderPrefix = "airlock-secret-"

// Secret is one of a box's secrets as the network helper gets it: in the
// headers of HTTPS requests to one of Hosts, Placeholder (what the box's
// environment variable Name holds) is replaced by Value.
type Secret struct {
	Name        string   `json:"name"`
	Value       string   `json:"value"`
	Placeholder string   `json:"placeholder"`
	Hosts       []string `json:"hosts"`
}

// SecretConfig is what the helper needs to substitute a box's secrets: the
// secrets and the box's CA (PEM certificate and PKCS #8 key), which signs
// the certificates the helper shows the box for the secrets' hosts. The
// helper reads it from a pipe (see HelperConfig.Secrets), never from a
// file or its command line.
type SecretConfig struct {
	Secrets []Secret `json:"secrets"`
	CACert  []byte   `json:"ca_cert"`
	CAKey   []byte   `json:"ca_key"`
}

// CheckSecretName checks a secret's name: an environment variable's name
// (a letter or '_', then letters, digits and '_'; at most 128 bytes).
func CheckSecretName(name string) error {
	if name == "" || len(name) > 128 {
		return fmt.Errorf("secret name %q: want 1-128 characters", name)
	}
	for i, c := range name {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return fmt.Errorf("secret name %q: want an environment variable's name (letters, digits and _, not a digit first)", name)
		}
	}
	if reservedSecretNames[name] {
		return fmt.Errorf("secret name %s: a variable the box's programs need (or airlock sets for the box's CA): name the secret otherwise", name)
	}
	return nil
}

// reservedSecretNames are variables a secret's placeholder must not
// replace: what programs in the box need to run, and what airlock sets so
// that they trust the box's CA.
var reservedSecretNames = map[string]bool{
	"PATH": true, "HOME": true, "USER": true, "SHELL": true, "PWD": true, "HOSTNAME": true, "TERM": true,
	"LANG": true, "LD_PRELOAD": true, "LD_LIBRARY_PATH": true, "PYTHONPATH": true, "TMPDIR": true,
	"SSL_CERT_FILE": true, "SSL_CERT_DIR": true, "REQUESTS_CA_BUNDLE": true, "CURL_CA_BUNDLE": true, "NODE_EXTRA_CA_CERTS": true,
}

// CheckSecretValue checks a secret's value: 1 to MaxSecretValue bytes,
// no control characters (it goes into an HTTP header).
func CheckSecretValue(name, value string) error {
	if value == "" {
		return fmt.Errorf("secret %s: empty value", name)
	}
	if len(value) > MaxSecretValue {
		return fmt.Errorf("secret %s: value of %d bytes: at most %d", name, len(value), MaxSecretValue)
	}
	for _, c := range []byte(value) {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("secret %s: the value has a control character (it is sent in an HTTP header)", name)
		}
	}
	return nil
}

// ParseSecretHost checks one host a secret is bound to and returns its
// canonical form: a DNS name, exact ("api.example.com") or a wildcard of
// the whole first label ("*.example.com": any name below example.com, not
// example.com itself); no IP address, no port (the secret is substituted
// on HTTPS, port 443, only).
func ParseSecretHost(host string) (string, error) {
	r, err := ParseRule(host)
	if err != nil {
		return "", fmt.Errorf("secret host %q: %v", host, strings.TrimPrefix(err.Error(), fmt.Sprintf("allow-net %q: ", host)))
	}
	if r.Name == "" || r.Port != 0 {
		return "", fmt.Errorf("secret host %q: want a DNS name (api.example.com or *.example.com), without IP or port", host)
	}
	return r.String(), nil
}

// CheckSecrets checks the secrets the helper gets (names, values, hosts,
// bounds).
func CheckSecrets(ss []Secret) error {
	if len(ss) > MaxSecrets {
		return fmt.Errorf("%d secrets: at most %d", len(ss), MaxSecrets)
	}
	seen := map[string]bool{}
	for _, s := range ss {
		if err := CheckSecretName(s.Name); err != nil {
			return err
		}
		if seen[s.Name] {
			return fmt.Errorf("secret %s given twice", s.Name)
		}
		seen[s.Name] = true
		if err := CheckSecretValue(s.Name, s.Value); err != nil {
			return err
		}
		if !strings.HasPrefix(s.Placeholder, PlaceholderPrefix) || len(s.Placeholder) < len(PlaceholderPrefix)+32 {
			return fmt.Errorf("secret %s: bad placeholder", s.Name)
		}
		if len(s.Hosts) == 0 || len(s.Hosts) > MaxSecretHosts {
			return fmt.Errorf("secret %s: %d hosts: want 1-%d", s.Name, len(s.Hosts), MaxSecretHosts)
		}
		for _, h := range s.Hosts {
			if _, err := ParseSecretHost(h); err != nil {
				return fmt.Errorf("secret %s: %w", s.Name, err)
			}
		}
	}
	return nil
}

// MatchSecretHost reports whether name (any case, a final dot allowed)
// matches a secret host as ParseSecretHost accepts it.
func MatchSecretHost(host, name string) bool {
	r, err := ParseRule(host)
	if err != nil || r.Name == "" {
		return false
	}
	return r.matchName(strings.TrimSuffix(strings.ToLower(name), "."))
}

// NewPlaceholder returns a fresh placeholder: PlaceholderPrefix and 128
// random bits in hex, not guessable from outside the box.
func NewPlaceholder() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return PlaceholderPrefix + hex.EncodeToString(b[:]), nil
}

// caValidity is how long a box's CA is valid; its leaves are valid for
// leafValidity and made again before they expire.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
)

// NewCA returns a new CA for one box (ECDSA P-256), named after it: its
// certificate and its PKCS #8 key, PEM-encoded. Only the certificate may
// enter the box.
func NewCA(name string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"airlock"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// parseCA reads a CA as NewCA made it.
func parseCA(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("box CA: not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("box CA: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("box CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, nil, errors.New("box CA: the key does not match the certificate")
	}
	return cert, key, nil
}
