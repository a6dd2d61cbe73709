package airlock

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/boxrecord"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/netstack/helper"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Secret is a value the box's code may use but never sees (see
// BoxOptions.Secrets and docs/network.md#secrets).
type Secret struct {
	// Value is the secret (1 to MaxSecretValue bytes, no control
	// characters). It never enters the box and is never marshalled: an
	// inspected box's Secret has Hosts only.
	Value string `json:"-"`
	// Hosts are the names it is sent to, exact ("api.example.com") or a
	// wildcard of the first label ("*.example.com"); 1 to MaxSecretHosts.
	Hosts []string
}

// Bounds of BoxOptions.Secrets.
const (
	MaxSecrets      = netstack.MaxSecrets
	MaxSecretValue  = netstack.MaxSecretValue
	MaxSecretHosts  = netstack.MaxSecretHosts
	secretsCAFile   = "/etc/airlock/ca.pem"
	secretsBundle   = "/etc/airlock/ca-bundle.pem"
	maxSystemBundle = 8 << 20
)

// checkSecrets checks and canonicalises opts.Secrets (names, values,
// hosts, bounds; a network; no Env entry of the same name).
func checkSecrets(opts *BoxOptions) error {
	if len(opts.Secrets) == 0 {
		return nil
	}
	if len(opts.Secrets) > MaxSecrets {
		return fmt.Errorf("%d secrets: at most %d", len(opts.Secrets), MaxSecrets)
	}
	if netMode(opts.Network, opts.AllowNet) == NetworkNone {
		return fmt.Errorf("secrets need a network: not with network mode %q", NetworkNone)
	}
	out := make(map[string]Secret, len(opts.Secrets))
	for name, s := range opts.Secrets {
		if err := netstack.CheckSecretName(name); err != nil {
			return err
		}
		if err := netstack.CheckSecretValue(name, s.Value); err != nil {
			return err
		}
		if len(s.Hosts) == 0 || len(s.Hosts) > MaxSecretHosts {
			return fmt.Errorf("secret %s: %d hosts: want 1-%d", name, len(s.Hosts), MaxSecretHosts)
		}
		hosts := make([]string, 0, len(s.Hosts))
		for _, h := range s.Hosts {
			c, err := netstack.ParseSecretHost(h)
			if err != nil {
				return fmt.Errorf("secret %s: %w", name, err)
			}
			hosts = append(hosts, c)
		}
		for _, kv := range opts.Env {
			if k, _, _ := strings.Cut(kv, "="); k == name {
				return fmt.Errorf("secret %s is also set in Env: the box's %s is the secret's placeholder; leave it out of Env", name, name)
			}
		}
		out[name] = Secret{Value: s.Value, Hosts: hosts}
	}
	opts.Secrets = out
	return nil
}

// secretNames returns the names of secrets, sorted.
func secretNames[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// newPlaceholders returns a fresh placeholder for each of secrets.
func newPlaceholders(secrets map[string]Secret) (map[string]string, error) {
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

// storedSecrets is the record's form of secrets (no values).
func storedSecrets(secrets map[string]Secret, placeholders map[string]string) []boxrecord.Secret {
	var out []boxrecord.Secret
	for _, n := range secretNames(secrets) {
		out = append(out, boxrecord.Secret{Name: n, Hosts: secrets[n].Hosts, Placeholder: placeholders[n]})
	}
	return out
}

// systemBundles are where images keep their system trust bundle (Debian,
// Ubuntu, Alpine, Arch; Fedora, RHEL; openSUSE; Alpine's other name): the
// first that exists gets the box's CA appended and is the base of
// secretsBundle.
var systemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"}

// secretsFile is the box directory's boxdir.Secrets: the values and the
// box's CA, 0600, read by the lifecycle code at each start (the helper
// gets them through a pipe).
type secretsFile struct {
	Values map[string]string `json:"values"`
	CACert []byte            `json:"ca_cert"`
	CAKey  []byte            `json:"ca_key"`
}

// writeSecrets makes the box's CA and writes its secrets file (none when
// it has no secrets).
func (b *Box) writeSecrets(secrets map[string]Secret) error {
	if len(secrets) == 0 {
		return nil
	}
	cert, key, err := netstack.NewCA("airlock box " + b.id + " CA")
	if err != nil {
		return fmt.Errorf("box %s: secrets: %w", b.id, err)
	}
	f := secretsFile{Values: map[string]string{}, CACert: cert, CAKey: key}
	for n, s := range secrets {
		f.Values[n] = s.Value
	}
	if err := saveSecrets(b.dir, &f); err != nil {
		return fmt.Errorf("box %s: secrets: %w", b.id, err)
	}
	return nil
}

// saveSecrets writes f as the box directory's secrets file (0600,
// replaced whole).
func saveSecrets(dir string, f *secretsFile) error {
	raw, _ := json.Marshal(f)
	p := filepath.Join(dir, boxdir.Secrets)
	if err := os.WriteFile(p+".tmp", raw, 0o600); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// readSecrets reads the box's secrets file (nil, nil: none).
func readSecrets(dir string) (*secretsFile, error) {
	raw, err := os.ReadFile(filepath.Join(dir, boxdir.Secrets))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f secretsFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", boxdir.Secrets, err)
	}
	return &f, nil
}

// secretConfig is what the box's network helper gets for cfg's secrets
// (nil: none, or none with a value on this host: a box imported or
// restored without them).
func (b *Box) secretConfig(cfg boxConfig) (*netstack.SecretConfig, error) {
	if len(cfg.Options.Secrets) == 0 {
		return nil, nil
	}
	f, err := readSecrets(b.dir)
	if err != nil || f == nil {
		return nil, err
	}
	sc := &netstack.SecretConfig{CACert: f.CACert, CAKey: f.CAKey}
	for _, n := range secretNames(cfg.Options.Secrets) {
		v, ok := f.Values[n]
		if !ok {
			continue
		}
		sc.Secrets = append(sc.Secrets, netstack.Secret{Name: n, Value: v, Placeholder: cfg.Placeholders[n], Hosts: cfg.Options.Secrets[n].Hosts})
	}
	if len(sc.Secrets) == 0 {
		return nil, nil
	}
	return sc, nil
}

// secretValues returns cfg's secrets with their values from the box
// directory (those without one left out; nil: none).
func (b *Box) secretValues(cfg boxConfig) (map[string]Secret, error) {
	if len(cfg.Options.Secrets) == 0 {
		return nil, nil
	}
	f, err := readSecrets(b.dir)
	if err != nil || f == nil {
		return nil, err
	}
	out := map[string]Secret{}
	for n, s := range cfg.Options.Secrets {
		if v, ok := f.Values[n]; ok {
			out[n] = Secret{Value: v, Hosts: s.Hosts}
		}
	}
	return out, nil
}

// SetSecret changes the value of the box's secret name: the box directory
// keeps the new one for later starts and, when the box runs, its network
// helper substitutes it from its next request on. The placeholder and the
// hosts stay. Errors: ErrInvalidArgument for an unknown secret or a bad
// value (the error never shows the value).
func (b *Box) SetSecret(ctx context.Context, name, value string) error {
	if err := netstack.CheckSecretValue(name, value); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	rec, unlock, err := b.lockLoad(ctx)
	defer unlock()
	if err != nil {
		return err
	}
	_, cfg := b.snapshot()
	if _, ok := cfg.Options.Secrets[name]; !ok {
		return fmt.Errorf("%w: box %s has no secret %s (secrets are given at Create)", ErrInvalidArgument, b.id, name)
	}
	f, err := readSecrets(b.dir)
	if err != nil || f == nil {
		return fmt.Errorf("box %s: its secrets file is gone or unreadable (%v): create the box again", b.id, err)
	}
	f.Values[name] = value
	if err := saveSecrets(b.dir, f); err != nil {
		return fmt.Errorf("box %s: secrets: %w", b.id, err)
	}
	if _, nic := helper.PID(b.dir); running(rec) && nic {
		if _, err := helper.Call(ctx, b.netBox(), netstack.Request{Op: "secret", Secret: &netstack.Secret{Name: name, Value: value}}); err != nil {
			return fmt.Errorf("box %s: set secret %s in its network helper: %w", b.id, name, err)
		}
	}
	return nil
}

// readBounded returns the box's file p when it has 1 to max bytes, else
// nil: a guest's file, read without holding more than max+1 bytes of it.
func (b *Box) readBounded(ctx context.Context, p string, max int64) []byte {
	rc, _, err := b.OpenFile(ctx, p)
	if err != nil {
		return nil
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil || int64(len(data)) > max {
		return nil
	}
	return data
}

// secretPolicy adds the hosts of cfg's secrets, on port 443, to an
// allowlist policy: a secret's hosts are reachable by its box.
func secretPolicy(p netstack.Policy, cfg boxConfig) netstack.Policy {
	if p.Mode != netstack.ModeAllowlist || len(cfg.Options.Secrets) == 0 || netMode(cfg.Options.Network, cfg.Options.AllowNet) == NetworkNone {
		return p
	}
	p.Allow = slices.Clone(p.Allow)
	for _, n := range secretNames(cfg.Options.Secrets) {
		for _, h := range cfg.Options.Secrets[n].Hosts {
			if e := h + ":443"; !slices.Contains(p.Allow, e) {
				p.Allow = append(p.Allow, e)
			}
		}
	}
	return p
}

// secretEnv is the environment cfg's secrets give the box's processes:
// each secret's placeholder, and the trust store with the box's CA for
// the TLS clients that read one from the environment.
func secretEnv(cfg boxConfig) []string {
	if len(cfg.Placeholders) == 0 {
		return nil
	}
	var env []string
	for _, n := range secretNames(cfg.Placeholders) {
		env = append(env, n+"="+cfg.Placeholders[n])
	}
	return append(env, "SSL_CERT_FILE="+secretsBundle, "REQUESTS_CA_BUNDLE="+secretsBundle,
		"CURL_CA_BUNDLE="+secretsBundle, "NODE_EXTRA_CA_CERTS="+secretsCAFile)
}

// installCA puts the box's CA certificate (never its key) in the guest's
// trust stores: secretsCAFile alone, secretsBundle (the image's system
// bundle and the CA) and appended to the system bundle when the image
// has one (systemBundles). A box without secrets is left alone, and so is a machine
// without disks of its own (the fake driver's: its files are the host's).
func (b *Box) installCA(ctx context.Context, cfg boxConfig) error {
	if len(cfg.Options.Secrets) == 0 {
		return nil
	}
	if _, ok := b.r.drv.(vmm.DiskBooter); !ok {
		return nil
	}
	f, err := readSecrets(b.dir)
	if err != nil || f == nil {
		return err
	}
	if err := b.MkdirAll(ctx, "/etc/airlock", 0o755); err != nil {
		return err
	}
	if err := b.WriteFile(ctx, secretsCAFile, f.CACert, 0o644); err != nil {
		return err
	}
	var sys []byte
	for _, p := range systemBundles {
		if sys = b.readBounded(ctx, p, maxSystemBundle); len(sys) == 0 {
			continue // none there, or too large (the guest's file: hostile input)
		}
		if !bytes.Contains(sys, f.CACert) {
			if !bytes.HasSuffix(sys, []byte("\n")) {
				sys = append(sys, '\n')
			}
			sys = append(sys, f.CACert...)
			if err := b.WriteFile(ctx, p, sys, 0o644); err != nil {
				return err
			}
		}
		break
	}
	// With no system bundle, secretsBundle is the CA alone.
	bundle := sys
	if !bytes.Contains(bundle, f.CACert) {
		bundle = append(append([]byte(nil), bundle...), f.CACert...)
	}
	return b.WriteFile(ctx, secretsBundle, bundle, 0o644)
}
