package airlock

import (
	"context"
	"fmt"
	"io"

	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/netstack/helper"
	"github.com/airlock-run/airlock/internal/secrets"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Secret is a value the box's code may use but never sees (see
// BoxOptions.Secrets and docs/network.md#secrets). Its fields are
// internal/secrets.Spec's, which the secrets engine converts it to.
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
	MaxSecrets     = netstack.MaxSecrets
	MaxSecretValue = netstack.MaxSecretValue
	MaxSecretHosts = netstack.MaxSecretHosts
)

// writeSecrets makes the box's CA and writes its secrets file (none when
// it has no secrets).
func (b *Box) writeSecrets(s map[string]Secret) error {
	if err := secrets.Write(b.dir, "airlock box "+b.id+" CA", s); err != nil {
		return fmt.Errorf("box %s: secrets: %w", b.id, err)
	}
	return nil
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
	f, err := secrets.Read(b.dir)
	if err != nil || f == nil {
		return fmt.Errorf("box %s: its secrets file is gone or unreadable (%v): create the box again", b.id, err)
	}
	f.Values[name] = value
	if err := secrets.Save(b.dir, f); err != nil {
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

// installCA puts the box's CA certificate (never its key) in the guest's
// trust stores (secrets.Install). A box without secrets is left alone,
// and so is a machine without disks of its own (the fake driver's: its
// files are the host's).
func (b *Box) installCA(ctx context.Context, cfg boxConfig) error {
	if len(cfg.Options.Secrets) == 0 {
		return nil
	}
	if _, ok := b.r.drv.(vmm.DiskBooter); !ok {
		return nil
	}
	f, err := secrets.Read(b.dir)
	if err != nil || f == nil {
		return err
	}
	if err := b.MkdirAll(ctx, "/etc/airlock", 0o755); err != nil {
		return err
	}
	return secrets.Install(f, func(p string) []byte { return b.readBounded(ctx, p, secrets.MaxSystemBundle) },
		func(p string, data []byte) error { return b.WriteFile(ctx, p, data, 0o644) })
}
