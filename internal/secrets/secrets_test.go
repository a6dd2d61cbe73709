package secrets

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/netstack"
)

// secret stands for the root package's Secret (Like).
type secret struct {
	Value string `json:"-"`
	Hosts []string
}

func TestCheck(t *testing.T) {
	in := map[string]secret{"API_KEY": {Value: "v", Hosts: []string{"API.Example.com"}}}
	out, err := Check(in, []string{"OTHER=1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := out["API_KEY"].Hosts; !reflect.DeepEqual(got, []string{"api.example.com"}) {
		t.Errorf("hosts %q: want the canonical api.example.com", got)
	}
	if in["API_KEY"].Hosts[0] != "API.Example.com" {
		t.Error("Check changed the caller's map")
	}
	for name, c := range map[string]struct {
		s   map[string]secret
		env []string
	}{
		"env":      {map[string]secret{"K": {Value: "v", Hosts: []string{"a.example"}}}, []string{"K=x"}},
		"no hosts": {map[string]secret{"K": {Value: "v"}}, nil},
		"bad host": {map[string]secret{"K": {Value: "v", Hosts: []string{"1.2.3.4"}}}, nil},
		"bad name": {map[string]secret{"1K": {Value: "v", Hosts: []string{"a.example"}}}, nil},
		"no value": {map[string]secret{"K": {Hosts: []string{"a.example"}}}, nil},
	} {
		if _, err := Check(c.s, c.env); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestFileAndConfig(t *testing.T) {
	dir := t.TempDir()
	if f, err := Read(dir); f != nil || err != nil {
		t.Fatalf("no file: %v, %v; want nil, nil", f, err)
	}
	s := map[string]secret{"A": {Value: "va", Hosts: []string{"a.example"}}, "B": {Value: "vb", Hosts: []string{"*.b.example"}}}
	if err := Write(dir, "test CA", s); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, boxdir.Secrets))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("secrets file: %v, %v; want mode 0600", st, err)
	}
	ph, err := NewPlaceholders(s)
	if err != nil || len(ph) != 2 || ph["A"] == ph["B"] {
		t.Fatalf("placeholders %v, %v", ph, err)
	}
	// The record keeps hosts and placeholders, never values.
	back, bph := FromStored[secret](Stored(s, ph))
	if back["A"].Value != "" || !reflect.DeepEqual(back["B"].Hosts, s["B"].Hosts) || !reflect.DeepEqual(bph, ph) {
		t.Errorf("record round trip: %v %v", back, bph)
	}
	vals, err := Values(dir, back)
	if err != nil || !reflect.DeepEqual(vals, s) {
		t.Errorf("values %v, %v; want %v", vals, err, s)
	}
	sc, err := HelperConfig(dir, back, bph)
	if err != nil || len(sc.Secrets) != 2 || sc.Secrets[0].Name != "A" || sc.Secrets[0].Value != "va" || sc.Secrets[0].Placeholder != ph["A"] || len(sc.CAKey) == 0 {
		t.Errorf("helper config %+v, %v", sc, err)
	}
	// A secret with no value on this host (imported) is left out.
	if sc, err := HelperConfig(dir, map[string]secret{"C": {Hosts: []string{"c.example"}}}, nil); sc != nil || err != nil {
		t.Errorf("helper config without values: %+v, %v; want nil, nil", sc, err)
	}
}

func TestPolicyAndEnv(t *testing.T) {
	s := map[string]secret{"A": {Hosts: []string{"a.example"}}}
	p := Policy(netstack.Policy{Mode: netstack.ModeAllowlist, Allow: []string{"x.example:80"}}, s)
	if !reflect.DeepEqual(p.Allow, []string{"x.example:80", "a.example:443"}) {
		t.Errorf("allowlist %q", p.Allow)
	}
	if p := Policy(netstack.Policy{Mode: netstack.ModePublic}, s); len(p.Allow) != 0 {
		t.Errorf("public policy got %q", p.Allow)
	}
	env := Env(map[string]string{"B": "pb", "A": "pa"})
	if env[0] != "A=pa" || env[1] != "B=pb" || !strings.HasPrefix(env[2], "SSL_CERT_FILE=") {
		t.Errorf("env %q", env)
	}
	if Env(nil) != nil {
		t.Error("env without secrets")
	}
}

func TestInstall(t *testing.T) {
	f := &File{CACert: []byte("CA\n")}
	files := map[string][]byte{"/etc/ssl/cert.pem": []byte("SYS")}
	read := func(p string) []byte { return files[p] }
	write := func(p string, data []byte) error { files[p] = data; return nil }
	if err := Install(f, read, write); err != nil {
		t.Fatal(err)
	}
	if string(files[CAFile]) != "CA\n" || string(files["/etc/ssl/cert.pem"]) != "SYS\nCA\n" || string(files[Bundle]) != "SYS\nCA\n" {
		t.Errorf("files %q", files)
	}
	// Again: the CA is not appended twice.
	if err := Install(f, read, write); err != nil || string(files["/etc/ssl/cert.pem"]) != "SYS\nCA\n" {
		t.Errorf("second install: %q, %v", files["/etc/ssl/cert.pem"], err)
	}
	// No system bundle: the bundle is the CA alone.
	files = map[string][]byte{}
	if err := Install(f, read, write); err != nil || string(files[Bundle]) != "CA\n" {
		t.Errorf("bundle without a system one: %q, %v", files[Bundle], err)
	}
}
