package airlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// TestSecretsFake checks, on the fake driver (no VM), what a box with
// secrets is on the host: its processes see a placeholder per box and
// secret, never the value; the value is in no record, listing or
// inspection, only in the box directory's 0600 secrets file; a second box
// gets other placeholders; bad secrets are refused.
func TestSecretsFake(t *testing.T) {
	h := fakeHarness(t)
	home := t.TempDir()
	r := h.open(t, home)
	ctx := context.Background()
	const value = "sk-test-0123456789-the-real-value"
	opts := airlock.BoxOptions{Image: h.image, Secrets: map[string]airlock.Secret{
		"TOKEN": {Value: value, Hosts: []string{"API.example.com", "*.example.org"}},
	}}
	b, err := r.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(ctx, true)
	res, err := b.Exec(ctx, "sh", []string{"-c", "printf %s \"$TOKEN\"; echo; env"}, airlock.ExecOptions{Timeout: 10 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %v %+v", err, res)
	}
	out := string(res.Stdout)
	ph := strings.SplitN(out, "\n", 2)[0]
	if !regexp.MustCompile(`^airlock-secret-[0-9a-f]{32}$`).MatchString(ph) {
		t.Errorf("the box's TOKEN is %q, want a placeholder", ph)
	}
	if strings.Contains(out, value) {
		t.Error("the box's environment holds the value")
	}
	for _, want := range []string{"SSL_CERT_FILE=/etc/airlock/ca-bundle.pem", "REQUESTS_CA_BUNDLE=/etc/airlock/ca-bundle.pem", "NODE_EXTRA_CA_CERTS=/etc/airlock/ca.pem"} {
		if !strings.Contains(out, want) {
			t.Errorf("the box's environment lacks %s", want)
		}
	}

	info, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := info.Options.Secrets["TOKEN"]
	if s.Value != "" || strings.Join(s.Hosts, ",") != "api.example.com,*.example.org" {
		t.Errorf("inspected secret: %+v", s)
	}
	raw, _ := json.Marshal(info)
	if strings.Contains(string(raw), value) || !strings.Contains(string(raw), "api.example.com") {
		t.Errorf("BoxInfo as JSON: %s", raw)
	}
	dir := filepath.Join(home, "boxes", b.ID())
	fi, err := os.Stat(filepath.Join(dir, "secrets.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secrets file: %v %v", fi, err)
	}
	// The value is in the secrets file and in no other file of the home
	// (the store, the helper's configuration, the logs).
	filepath.Walk(home, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || filepath.Base(p) == "secrets.json" || fi.Size() > 64<<20 {
			return nil
		}
		if raw, err := os.ReadFile(p); err == nil && strings.Contains(string(raw), value) {
			t.Errorf("%s holds the value", p)
		}
		return nil
	})

	// A second box of the same options: other placeholders.
	b2, err := r.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Remove(ctx, true)
	res2, _ := b2.Exec(ctx, "sh", []string{"-c", "printf %s \"$TOKEN\""}, airlock.ExecOptions{Timeout: 10 * time.Second})
	if string(res2.Stdout) == ph || !strings.HasPrefix(string(res2.Stdout), "airlock-secret-") {
		t.Errorf("second box's placeholder %q (first %q)", res2.Stdout, ph)
	}

	// Survives stop/start: same placeholder, the helper gets the value.
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	res, _ = b.Exec(ctx, "sh", []string{"-c", "printf %s \"$TOKEN\""}, airlock.ExecOptions{Timeout: 10 * time.Second})
	if string(res.Stdout) != ph {
		t.Errorf("after a restart TOKEN is %q, want %q", res.Stdout, ph)
	}

	bad := map[string]map[string]airlock.Secret{
		"name":          {"1X": {Value: "v", Hosts: []string{"a.example"}}},
		"empty value":   {"X": {Hosts: []string{"a.example"}}},
		"newline":       {"X": {Value: "a\nb", Hosts: []string{"a.example"}}},
		"no hosts":      {"X": {Value: "v"}},
		"an IP host":    {"X": {Value: "v", Hosts: []string{"203.0.113.7"}}},
		"a port":        {"X": {Value: "v", Hosts: []string{"a.example:8443"}}},
		"too long":      {"X": {Value: strings.Repeat("v", airlock.MaxSecretValue+1), Hosts: []string{"a.example"}}},
		"env conflict":  {"HOME": {Value: "v", Hosts: []string{"a.example"}}},
		"no network":    {"X": {Value: "v", Hosts: []string{"a.example"}}},
		"a bad pattern": {"X": {Value: "v", Hosts: []string{"a.*.example"}}},
	}
	for what, ss := range bad {
		o := airlock.BoxOptions{Image: h.image, Secrets: ss}
		switch what {
		case "env conflict":
			o.Env = []string{"HOME=/x"}
		case "no network":
			o.Network = airlock.NetworkNone
		}
		_, err := r.Create(ctx, o)
		if !errors.Is(err, airlock.ErrInvalidArgument) {
			t.Errorf("%s: Create: %v, want ErrInvalidArgument", what, err)
		} else if strings.Contains(err.Error(), "v\n") || strings.Contains(err.Error(), strings.Repeat("v", 100)) {
			t.Errorf("%s: the error shows the value: %v", what, err)
		}
	}
}

// TestSecretsForkFake: a fork's children get the box's secrets with
// placeholders and a CA of their own (fake.Snapshotting: no VM).
func TestSecretsForkFake(t *testing.T) {
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	home := t.TempDir()
	r := h.open(t, home)
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Secrets: map[string]airlock.Secret{
		"TOKEN": {Value: "sk-fork-value", Hosts: []string{"api.example.com"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(ctx, true)
	token := func(b *airlock.Box) string {
		res, err := b.Exec(ctx, "sh", []string{"-c", "printf %s \"$TOKEN\""}, airlock.ExecOptions{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Stdout)
	}
	parent := token(b)
	kids, err := b.Fork(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer kids[0].Remove(ctx, true)
	child := token(kids[0])
	if !strings.HasPrefix(child, "airlock-secret-") || child == parent {
		t.Errorf("child's placeholder %q, parent's %q", child, parent)
	}
	info, _ := kids[0].Info(ctx)
	if s := info.Options.Secrets["TOKEN"]; s.Value != "" || len(s.Hosts) != 1 {
		t.Errorf("child's secret: %+v", s)
	}
	ca := func(id string) string {
		raw, err := os.ReadFile(filepath.Join(home, "boxes", id, "secrets.json"))
		if err != nil || !strings.Contains(string(raw), "sk-fork-value") {
			t.Fatalf("secrets file of %s: %v", id, err)
		}
		var f struct {
			CACert []byte `json:"ca_cert"`
		}
		json.Unmarshal(raw, &f)
		return string(f.CACert)
	}
	if ca(b.ID()) == ca(kids[0].ID()) {
		t.Error("the child has its parent's CA")
	}
}

// TestSetSecretFake: SetSecret keeps the new value for the box's next
// starts (its secrets file) and refuses unknown secrets and bad values.
func TestSetSecretFake(t *testing.T) {
	h := fakeHarness(t)
	home := t.TempDir()
	r := h.open(t, home)
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image, Secrets: map[string]airlock.Secret{
		"TOKEN": {Value: "old-value", Hosts: []string{"api.example.com"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(ctx, true)
	if err := b.SetSecret(ctx, "TOKEN", "new-value"); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(home, "boxes", b.ID(), "secrets.json"))
	if !strings.Contains(string(raw), "new-value") || strings.Contains(string(raw), "old-value") {
		t.Errorf("secrets file after SetSecret: %s", raw)
	}
	for _, c := range [][2]string{{"NOSUCH", "v"}, {"TOKEN", ""}, {"TOKEN", "a\nb-secret"}} {
		if err := b.SetSecret(ctx, c[0], c[1]); !errors.Is(err, airlock.ErrInvalidArgument) || strings.Contains(err.Error(), "b-secret") {
			t.Errorf("SetSecret(%q): %v", c[0], err)
		}
	}
}
