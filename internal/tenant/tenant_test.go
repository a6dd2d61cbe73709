package tenant

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAddLookupRemove: the file keeps only a token's hash (0600), Lookup
// finds the tenant by its token and nothing by another, names are unique,
// and Remove takes one out.
func TestAddLookupRemove(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "tenants.json")
	alice, bob := NewToken(), NewToken()
	if len(alice) != 64 || alice == bob {
		t.Fatalf("tokens %q %q: want 64 hex digits, each new", alice, bob)
	}
	if err := Add(path, Tenant{Name: "alice", Quota: Quota{Boxes: 2}}, alice); err != nil {
		t.Fatal(err)
	}
	if err := Add(path, Tenant{Name: "bob", Grants: Grants{Publish: true}}, bob); err != nil {
		t.Fatal(err)
	}
	if err := Add(path, Tenant{Name: "alice"}, NewToken()); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a second alice: %v, want an error saying she exists", err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), alice) || !strings.Contains(string(raw), Hash(alice)) {
		t.Errorf("the file holds the token or lacks its hash:\n%s", raw)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, want 0600", fi.Mode().Perm())
	}
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if tn, ok := f.Lookup(alice); !ok || tn.Name != "alice" || tn.Quota.Boxes != 2 {
		t.Errorf("Lookup(alice's token) = %+v %v", tn, ok)
	}
	if tn, ok := f.Lookup(bob); !ok || tn.Name != "bob" || !tn.Grants.Publish {
		t.Errorf("Lookup(bob's token) = %+v %v", tn, ok)
	}
	for _, tok := range []string{"", "x", Hash(alice), alice + " "} {
		if tn, ok := f.Lookup(tok); ok {
			t.Errorf("Lookup(%q) found %s", tok, tn.Name)
		}
	}
	if err := Remove(path, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path, "alice"); err == nil {
		t.Error("removing alice twice: no error")
	}
	f, _ = Load(path)
	if _, ok := f.Lookup(alice); ok {
		t.Error("alice's token works after Remove")
	}
}

// TestParseRefuses: a file with a bad name, a reserved one, a duplicate,
// a bad hash, a shared token, a negative quota or an unknown field is
// refused, saying why.
func TestParseRefuses(t *testing.T) {
	h := Hash("t")
	for name, c := range map[string]struct{ json, want string }{
		"bad name":      {`{"tenants":[{"name":"Alice","token_sha256":"` + h + `"}]}`, "tenant name"},
		"admin":         {`{"tenants":[{"name":"admin","token_sha256":"` + h + `"}]}`, "server's own"},
		"twice":         {`{"tenants":[{"name":"a","token_sha256":"` + h + `"},{"name":"a","token_sha256":"` + Hash("u") + `"}]}`, "twice"},
		"short hash":    {`{"tenants":[{"name":"a","token_sha256":"abcd"}]}`, "64 hex"},
		"shared token":  {`{"tenants":[{"name":"a","token_sha256":"` + h + `"},{"name":"b","token_sha256":"` + h + `"}]}`, "another tenant's"},
		"negative":      {`{"tenants":[{"name":"a","token_sha256":"` + h + `","quota":{"boxes":-1}}]}`, "negative"},
		"unknown field": {`{"tenants":[{"name":"a","token_sha256":"` + h + `","quotas":{}}]}`, "unknown field"},
	} {
		if _, err := Parse([]byte(c.json)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
}

// TestSetWatch: a Set takes the file's changes without being asked, and a
// reload on demand; a broken file keeps the tenants loaded before.
func TestSetWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.json")
	a := NewToken()
	if err := Add(path, Tenant{Name: "a"}, a); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reload := make(chan struct{})
	errs := make(chan error, 16)
	go s.Watch(ctx, reload, func(err error) { errs <- err })
	b := NewToken()
	if err := Add(path, Tenant{Name: "b"}, b); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := s.Lookup(b); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Set did not take the added tenant within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	reload <- struct{}{}
	for err := range errs {
		if err != nil {
			break // the broken file's reload failed
		}
	}
	if _, ok := s.Lookup(a); !ok {
		t.Error("a broken file dropped the tenants loaded before")
	}
	var nilSet *Set
	if _, ok := nilSet.Lookup(a); ok {
		t.Error("a nil Set found a tenant")
	}
}
