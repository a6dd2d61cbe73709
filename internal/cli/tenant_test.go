package cli_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCLITenants: airlock tenant add prints a token once and keeps only
// its hash; airlock serve --tenants serves it over TCP, takes tenants
// added and removed without a restart, and lives through SIGHUP (its
// reload signal).
func TestCLITenants(t *testing.T) {
	home := t.TempDir()
	c := cli{t, home}
	out, errs, code := c.run("tenant", "add", "alice", "--max-boxes", "2", "--max-execs", "4")
	tok := strings.TrimSpace(out)
	if code != 0 || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(tok) || !strings.Contains(errs, "shown this once") {
		t.Fatalf("tenant add: code %d stdout %q stderr %q; want a token", code, out, errs)
	}
	file := filepath.Join(home, "tenants.json")
	raw, err := os.ReadFile(file)
	if err != nil || strings.Contains(string(raw), tok) {
		t.Fatalf("the tenants file %s (%v) holds the token itself:\n%s", file, err, raw)
	}
	if _, errs, code := c.run("tenant", "add", "alice"); code == 0 || !strings.Contains(errs, "exists") {
		t.Errorf("a second alice: code %d %q, want an error saying she exists", code, errs)
	}
	if _, errs, code := c.run("tenant", "add", "admin"); code != 125 || !strings.Contains(errs, "server's own") {
		t.Errorf("tenant add admin: code %d %q, want 125", code, errs)
	}
	if out, _, code := c.run("tenant", "ls"); code != 0 || !regexp.MustCompile(`(?m)^alice\s+2\s+-\s+-\s+-\s+-\s+4\s`).MatchString(out) {
		t.Errorf("tenant ls: code %d\n%s", code, out)
	}

	dir, _ := os.MkdirTemp("", "airlock-tenant-")
	defer os.RemoveAll(dir)
	srv := exec.Command(airlockBin, "serve", "--listen", "127.0.0.1:0", "--token", "s3cret", "--tenants", file, "--socket", filepath.Join(dir, "a.sock"))
	srv.Env = append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_URL=")
	se, _ := srv.StderrPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	logs := readLines(se)
	addr := logs.waitFor(t, regexp.MustCompile(`tcp=(127\.0\.0\.1:\d+)`))[1]
	status := func(token string) int {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/boxes", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60 s", what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if st := status(tok); st != 200 {
		t.Errorf("alice's token: %d, want 200", st)
	}
	out, _, _ = c.run("tenant", "add", "bob")
	bob := strings.TrimSpace(out)
	eventually("bob's token works once added", func() bool { return status(bob) == 200 })
	if err := srv.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	logs.waitFor(t, regexp.MustCompile(`tenants reloaded`))
	if _, _, code := c.run("tenant", "rm", "alice"); code != 0 {
		t.Fatalf("tenant rm: code %d", code)
	}
	eventually("alice's token is refused once removed", func() bool { return status(tok) == 401 })
	if st := status("s3cret"); st != 200 {
		t.Errorf("the server's own token: %d, want 200", st)
	}
	srv.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not exit on SIGTERM")
	}
}
