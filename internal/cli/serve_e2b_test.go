package cli_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestServeE2B: airlock serve --e2b refuses a token that cannot make an
// E2B API key, and with a hex token answers E2B's control plane on its own
// listener, to the key e2b_TOKEN only.
func TestServeE2B(t *testing.T) {
	home := t.TempDir()
	dir, _ := os.MkdirTemp("", "airlock-serve-")
	defer os.RemoveAll(dir)
	env := append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+vmtest.ImagesDir(), "AIRLOCK_SOCKET="+filepath.Join(dir, "a.sock"), "AIRLOCK_TOKEN=")

	bad := exec.Command(airlockBin, "serve", "--e2b", "127.0.0.1:0", "--token", "s3cret")
	bad.Env = env
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "hex") {
		t.Fatalf("serve --e2b with a token that is not hex: %v %s", err, out)
	}

	token := strings.Repeat("0a1b", 8)
	srv := exec.Command(airlockBin, "serve", "--e2b", "127.0.0.1:0", "--token", token)
	srv.Env = env
	se, _ := srv.StderrPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Wait()
	defer srv.Process.Kill()
	addr := readLines(se).waitFor(t, regexp.MustCompile(`e2b=(127\.0\.0\.1:\d+)`))[1]
	for key, want := range map[string]int{"e2b_" + token: 200, token: 401, "": 401} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v2/sandboxes", nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("key %q: %d, want %d", key, resp.StatusCode, want)
		}
	}
	srv.Process.Kill()
	srv.Wait()

	// With the generated token, the listening line says where it is
	// stored, and how E2B_API_KEY is made of it (docs/e2b.md).
	gen := exec.Command(airlockBin, "serve", "--e2b", "127.0.0.1:0")
	gen.Env = env
	ge, _ := gen.StderrPipe()
	if err := gen.Start(); err != nil {
		t.Fatal(err)
	}
	defer gen.Wait()
	defer gen.Process.Kill()
	file := filepath.Join(home, "server.token")
	readLines(ge).waitFor(t, regexp.MustCompile(`e2b=127\.0\.0\.1:\d+ .*E2B_API_KEY="e2b_\$\(cat `+regexp.QuoteMeta(file)+`\)" token_file=`+regexp.QuoteMeta(file)))
}
