// Package secrets is the host side of a box's secrets (BoxOptions.Secrets,
// docs/network.md#secrets): their checks, placeholders, the record's form
// (no values), the box directory's secrets file (values and the box's CA,
// 0600), the network helper's configuration, the box's environment and
// the CA's place in the guest's trust stores. The root package keeps the
// public Secret type and wires these into Box; this package never sees a
// Box.
package secrets

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/boxrecord"
	"github.com/airlock-run/airlock/internal/netstack"
)

// Spec is a secret: its value and the hosts it is sent to. It has the
// fields of the root package's Secret, so that the functions here take
// that type as it is (Like).
type Spec struct {
	Value string `json:"-"`
	Hosts []string
}

// Like is a type with Spec's fields (the root package's Secret): the
// functions here convert it to Spec and back.
type Like interface {
	~struct {
		Value string `json:"-"`
		Hosts []string
	}
}

// Paths in the guest and bounds.
const (
	// CAFile is the box's CA certificate alone, in the guest.
	CAFile = "/etc/airlock/ca.pem"
	// Bundle is the image's system bundle and the box's CA, in the guest.
	Bundle = "/etc/airlock/ca-bundle.pem"
	// MaxSystemBundle is the largest system bundle read from the guest,
	// in bytes.
	MaxSystemBundle = 8 << 20
)

// Check checks and canonicalises secrets (names, values, hosts; no env
// entry of the same name) and returns them as a new map.
func Check[S Like](secrets map[string]S, env []string) (map[string]S, error) {
	out := make(map[string]S, len(secrets))
	for name, sv := range secrets {
		s := Spec(sv)
		if err := netstack.CheckSecretName(name); err != nil {
			return nil, err
		}
		if err := netstack.CheckSecretValue(name, s.Value); err != nil {
			return nil, err
		}
		if len(s.Hosts) == 0 || len(s.Hosts) > netstack.MaxSecretHosts {
			return nil, fmt.Errorf("secret %s: %d hosts: want 1-%d", name, len(s.Hosts), netstack.MaxSecretHosts)
		}
		hosts := make([]string, 0, len(s.Hosts))
		for _, h := range s.Hosts {
			c, err := netstack.ParseSecretHost(h)
			if err != nil {
				return nil, fmt.Errorf("secret %s: %w", name, err)
			}
			hosts = append(hosts, c)
		}
		for _, kv := range env {
			if k, _, _ := strings.Cut(kv, "="); k == name {
				return nil, fmt.Errorf("secret %s is also set in Env: the box's %s is the secret's placeholder; leave it out of Env", name, name)
			}
		}
		out[name] = S(Spec{Value: s.Value, Hosts: hosts})
	}
	return out, nil
}

// Names returns the names of secrets, sorted.
func Names[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// NewPlaceholders returns a fresh placeholder for each of secrets.
func NewPlaceholders[V any](secrets map[string]V) (map[string]string, error) {
	if len(secrets) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for n := range secrets {
		p, err := netstack.NewPlaceholder()
		if err != nil {
			return nil, err
		}
		out[n] = p
	}
	return out, nil
}

// Stored is the record's form of secrets (no values).
func Stored[S Like](secrets map[string]S, placeholders map[string]string) []boxrecord.Secret {
	var out []boxrecord.Secret
	for _, n := range Names(secrets) {
		out = append(out, boxrecord.Secret{Name: n, Hosts: Spec(secrets[n]).Hosts, Placeholder: placeholders[n]})
	}
	return out
}

// FromStored is the record's secrets (no values) and their placeholders
// by name (nil, nil: none).
func FromStored[S Like](stored []boxrecord.Secret) (map[string]S, map[string]string) {
	var secrets map[string]S
	var placeholders map[string]string
	for _, s := range stored {
		if secrets == nil {
			secrets, placeholders = map[string]S{}, map[string]string{}
		}
		secrets[s.Name] = S(Spec{Hosts: s.Hosts})
		placeholders[s.Name] = s.Placeholder
	}
	return secrets, placeholders
}

// SystemBundles are where images keep their system trust bundle (Debian,
// Ubuntu, Alpine, Arch; Fedora, RHEL; openSUSE; Alpine's other name): the
// first that exists gets the box's CA appended and is the base of
// Bundle.
var SystemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"}

// File is the box directory's boxdir.Secrets: the values and the
// box's CA, 0600, read by the lifecycle code at each start (the helper
// gets them through a pipe).
type File struct {
	Values map[string]string `json:"values"`
	CACert []byte            `json:"ca_cert"`
	CAKey  []byte            `json:"ca_key"`
}

// Write makes a CA named caName and writes the secrets file of the box
// directory dir (none when there are no secrets).
func Write[S Like](dir, caName string, secrets map[string]S) error {
	if len(secrets) == 0 {
		return nil
	}
	cert, key, err := netstack.NewCA(caName)
	if err != nil {
		return err
	}
	f := File{Values: map[string]string{}, CACert: cert, CAKey: key}
	for n, s := range secrets {
		f.Values[n] = Spec(s).Value
	}
	return Save(dir, &f)
}

// Save writes f as the box directory's secrets file (0600,
// replaced whole).
func Save(dir string, f *File) error {
	raw, _ := json.Marshal(f)
	p := filepath.Join(dir, boxdir.Secrets)
	if err := os.WriteFile(p+".tmp", raw, 0o600); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// Read reads the box's secrets file (nil, nil: none).
func Read(dir string) (*File, error) {
	raw, err := os.ReadFile(filepath.Join(dir, boxdir.Secrets))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", boxdir.Secrets, err)
	}
	return &f, nil
}

// HelperConfig is what the network helper of the box directory dir gets
// for secrets (nil: none, or none with a value on this host: a box
// imported or restored without them).
func HelperConfig[S Like](dir string, secrets map[string]S, placeholders map[string]string) (*netstack.SecretConfig, error) {
	if len(secrets) == 0 {
		return nil, nil
	}
	f, err := Read(dir)
	if err != nil || f == nil {
		return nil, err
	}
	sc := &netstack.SecretConfig{CACert: f.CACert, CAKey: f.CAKey}
	for _, n := range Names(secrets) {
		v, ok := f.Values[n]
		if !ok {
			continue
		}
		sc.Secrets = append(sc.Secrets, netstack.Secret{Name: n, Value: v, Placeholder: placeholders[n], Hosts: Spec(secrets[n]).Hosts})
	}
	if len(sc.Secrets) == 0 {
		return nil, nil
	}
	return sc, nil
}

// Values returns secrets with their values from the box directory dir
// (those without one left out; nil: none).
func Values[S Like](dir string, secrets map[string]S) (map[string]S, error) {
	if len(secrets) == 0 {
		return nil, nil
	}
	f, err := Read(dir)
	if err != nil || f == nil {
		return nil, err
	}
	out := map[string]S{}
	for n, s := range secrets {
		if v, ok := f.Values[n]; ok {
			out[n] = S(Spec{Value: v, Hosts: Spec(s).Hosts})
		}
	}
	return out, nil
}

// Policy adds the hosts of secrets, on port 443, to an allowlist policy:
// a secret's hosts are reachable by its box.
func Policy[S Like](p netstack.Policy, secrets map[string]S) netstack.Policy {
	if p.Mode != netstack.ModeAllowlist || len(secrets) == 0 {
		return p
	}
	p.Allow = slices.Clone(p.Allow)
	for _, n := range Names(secrets) {
		for _, h := range Spec(secrets[n]).Hosts {
			if e := h + ":443"; !slices.Contains(p.Allow, e) {
				p.Allow = append(p.Allow, e)
			}
		}
	}
	return p
}

// Env is the environment a box's secrets give its processes: each
// secret's placeholder, and the trust store with the box's CA for the TLS
// clients that read one from the environment.
func Env(placeholders map[string]string) []string {
	if len(placeholders) == 0 {
		return nil
	}
	var env []string
	for _, n := range Names(placeholders) {
		env = append(env, n+"="+placeholders[n])
	}
	return append(env, "SSL_CERT_FILE="+Bundle, "REQUESTS_CA_BUNDLE="+Bundle,
		"CURL_CA_BUNDLE="+Bundle, "NODE_EXTRA_CA_CERTS="+CAFile)
}

// Install puts f's CA certificate (never its key) in the guest's trust
// stores: CAFile alone, Bundle (the image's system bundle and the CA) and
// appended to the system bundle when the image has one (SystemBundles).
// read returns the guest's file when it has 1 to MaxSystemBundle bytes
// (else nil); write writes one (0644). The caller makes /etc/airlock.
func Install(f *File, read func(p string) []byte, write func(p string, data []byte) error) error {
	if err := write(CAFile, f.CACert); err != nil {
		return err
	}
	var sys []byte
	for _, p := range SystemBundles {
		if sys = read(p); len(sys) == 0 {
			continue // none there, or too large (the guest's file: hostile input)
		}
		if !bytes.Contains(sys, f.CACert) {
			if !bytes.HasSuffix(sys, []byte("\n")) {
				sys = append(sys, '\n')
			}
			sys = append(sys, f.CACert...)
			if err := write(p, sys); err != nil {
				return err
			}
		}
		break
	}
	// With no system bundle, Bundle is the CA alone.
	bundle := sys
	if !bytes.Contains(bundle, f.CACert) {
		bundle = append(append([]byte(nil), bundle...), f.CACert...)
	}
	return write(Bundle, bundle)
}
