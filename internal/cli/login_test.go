package cli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	airlockcli "github.com/airlock-run/airlock/internal/cli"
	"github.com/airlock-run/airlock/internal/image/imagetest"
)

// airlockIn runs the CLI with stdin in.
func airlockIn(t *testing.T, in string, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	root := airlockcli.NewRoot(airlockcli.Streams{In: strings.NewReader(in), Out: &out, Err: &errb})
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

// privateRegistry is an OCI registry on loopback that wants basic auth
// (alice, s3cret) for every request.
func privateRegistry(t *testing.T) string {
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="private"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestLoginLogout: airlock login checks the credentials against a real
// registry on loopback that wants basic auth, keeps them in Docker's
// config.json (0600, other settings kept) only when they are right, a
// pull of a private image then works; logout removes them and the pull
// fails saying to log in.
func TestLoginLogout(t *testing.T) {
	t.Setenv("AIRLOCK_HOME", t.TempDir())
	t.Setenv("AIRLOCK_CACHE", t.TempDir())
	t.Setenv("AIRLOCK_IMAGES", "")
	t.Setenv("HOME", t.TempDir())
	cfgDir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", cfgDir)
	cfg := filepath.Join(cfgDir, "config.json")

	host := privateRegistry(t)
	ref := host + "/private/app:v1"
	tag, _ := name.NewTag(ref)
	img := imagetest.Image(t, []string{"/a"}, imagetest.Tar(t, imagetest.Entry{Name: "a", Body: "a"}))
	if err := remote.Write(tag, img, remote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"})); err != nil {
		t.Fatal(err)
	}

	_, _, err := airlock(t, "pull", ref)
	if err == nil || !strings.Contains(err.Error(), "airlock login "+host) {
		t.Fatalf("pull before login: %v", err)
	}

	// A wrong password: the registry's 401, named; nothing kept.
	_, _, err = airlockIn(t, "wrong\n", "login", "-u", "alice", "--password-stdin", host)
	if err == nil || !strings.Contains(err.Error(), host+" refused the user name or password") || !strings.Contains(err.Error(), "401") {
		t.Fatalf("login with a wrong password: %v", err)
	}
	if _, err := os.Stat(cfg); !os.IsNotExist(err) {
		t.Fatalf("a failed login wrote %s: %v", cfg, err)
	}
	// No password and no terminal: says how to give one.
	if _, _, err = airlockIn(t, "", "login", "-u", "alice", host); err == nil || !strings.Contains(err.Error(), "--password-stdin") {
		t.Fatalf("login without a password off a terminal: %v", err)
	}

	// The right one, into a config.json with other settings.
	if err := os.WriteFile(cfg, []byte(`{"psFormat": "table {{.ID}}", "auths": {"other.example": {"auth": "eDp5"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := airlockIn(t, "s3cret\n", "login", "-u", "alice", "--password-stdin", host)
	if err != nil || !strings.HasPrefix(out, "Login Succeeded") {
		t.Fatalf("login: %v %q", err, out)
	}
	st, err := os.Stat(cfg)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config.json after login: %v %v", st, err)
	}
	var doc struct {
		PsFormat string                       `json:"psFormat"`
		Auths    map[string]map[string]string `json:"auths"`
	}
	b, _ := os.ReadFile(cfg)
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.PsFormat != "table {{.ID}}" || doc.Auths["other.example"]["auth"] != "eDp5" ||
		doc.Auths[host]["auth"] != base64.StdEncoding.EncodeToString([]byte("alice:s3cret")) {
		t.Fatalf("config.json after login:\n%s", b)
	}
	if out, errs, err := airlock(t, "pull", ref); err != nil || !strings.HasPrefix(out, "Pulled "+ref) {
		t.Fatalf("pull after login: %v %q %q", err, out, errs)
	}

	out, _, err = airlock(t, "logout", host)
	if err != nil || !strings.HasPrefix(out, "Removing login credentials for "+host) {
		t.Fatalf("logout: %v %q", err, out)
	}
	b, _ = os.ReadFile(cfg)
	if strings.Contains(string(b), host) || !strings.Contains(string(b), "other.example") {
		t.Fatalf("config.json after logout:\n%s", b)
	}
	_, _, err = airlock(t, "pull", ref)
	if err == nil || !strings.Contains(err.Error(), "refused access") || !strings.Contains(err.Error(), "airlock login "+host) {
		t.Fatalf("pull after logout: %v", err)
	}
	if out, _, err = airlock(t, "logout", host); err != nil || !strings.HasPrefix(out, "Not logged in") {
		t.Fatalf("second logout: %v %q", err, out)
	}

	// A credential helper config.json names is used, not bypassed: one
	// that is not installed is named, and the file is left alone.
	helperCfg := `{"credsStore": "airlock-test-none"}`
	os.WriteFile(cfg, []byte(helperCfg), 0o600)
	_, _, err = airlockIn(t, "s3cret\n", "login", "-u", "alice", "--password-stdin", host)
	if err == nil || !strings.Contains(err.Error(), "docker-credential-airlock-test-none is not on PATH") {
		t.Fatalf("login with a missing credential helper: %v", err)
	}
	if b, _ := os.ReadFile(cfg); string(b) != helperCfg {
		t.Fatalf("config.json changed: %s", b)
	}
}

// TestLoginToken: a registry that answers with a Bearer challenge (as
// Docker Hub and ghcr.io do): login fetches a token from the realm with
// the credentials; a wrong password is the realm's 401, named.
func TestLoginToken(t *testing.T) {
	t.Setenv("AIRLOCK_HOME", t.TempDir())
	t.Setenv("AIRLOCK_CACHE", t.TempDir())
	t.Setenv("AIRLOCK_IMAGES", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "s3cret" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			io.WriteString(w, `{"token":"tok-alice"}`)
			return
		}
		if r.Header.Get("Authorization") != "Bearer tok-alice" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+srv.URL+`/token",service="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	_, _, err := airlockIn(t, "nope\n", "login", "-u", "alice", "--password-stdin", host)
	if err == nil || !strings.Contains(err.Error(), host+" refused the user name or password") {
		t.Fatalf("login with a wrong password: %v", err)
	}
	if out, _, err := airlockIn(t, "s3cret\n", "login", "-u", "alice", "--password-stdin", host); err != nil || !strings.HasPrefix(out, "Login Succeeded") {
		t.Fatalf("login: %v %q", err, out)
	}
}
