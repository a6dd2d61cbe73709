package cli_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestServePool: `airlock serve --pool python:slim=1` fills its pool; a
// box created through the API comes from it (its first context is the
// kernel parked in the pool's template), the list shows only that box,
// and after SIGTERM nothing of the home runs.
func TestServePool(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM; skipped with -short")
	}
	if why := vmtest.Missing(); why != "" {
		if os.Getenv("AIRLOCK_REQUIRE_VM") == "1" {
			t.Fatalf("cannot boot boxes: %s", why)
		}
		t.Skipf("cannot boot boxes: %s", why)
	}
	home := t.TempDir()
	dir, _ := os.MkdirTemp("", "airlock-serve-")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "a.sock")
	srv := exec.Command(airlockBin, "serve", "--pool", vmtest.DefaultImage+"=1")
	srv.Env = append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+vmtest.ImagesDir(), "AIRLOCK_SOCKET="+sock, "AIRLOCK_URL=")
	se, _ := srv.StderrPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	logs := readLines(se)
	logs.waitFor(t, regexp.MustCompile(`warm pool ready`))
	uc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	do := func(method, path, body string, out any) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://airlock"+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := uc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %d", method, path, resp.StatusCode)
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatal(err)
			}
		}
	}
	var box, cx struct{ ID string }
	t0 := time.Now()
	do("POST", "/v1/boxes", `{}`, &box)
	do("POST", "/v1/boxes/"+box.ID+"/contexts", `{}`, &cx)
	var cell struct{ Value string }
	do("POST", "/v1/boxes/"+box.ID+"/contexts/"+cx.ID+"/run", `{"code":"import os; os.getpid()"}`, &cell)
	t.Logf("create, context, first cell: %s", time.Since(t0))
	var ex struct{ Stdout string }
	do("POST", "/v1/boxes/"+box.ID+"/exec", `{"cmd":["cat","/tmp/.airlock-codebox/run/warm/pid"]}`, &ex)
	if strings.TrimSpace(ex.Stdout) != cell.Value || cell.Value == "" {
		t.Errorf("context pid %q, parked kernel %q: the box did not come from the pool", cell.Value, ex.Stdout)
	}
	var list struct{ Boxes []struct{ ID string } }
	do("GET", "/v1/boxes", "", &list)
	if len(list.Boxes) != 1 || list.Boxes[0].ID != box.ID {
		t.Errorf("list: %+v, want only %s", list, box.ID)
	}
	resp, err := uc.Get("http://airlock/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^airlock_pool_claims_total\{image="` + regexp.QuoteMeta(vmtest.DefaultImage) + `",key="[0-9a-f]+"\} 1$`).Match(mb) {
		t.Errorf("metrics do not count the claim:\n%s", mb)
	}
	do("DELETE", "/v1/boxes/"+box.ID+"?force=true", "", nil)
	srv.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve after SIGTERM: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("serve did not exit on SIGTERM")
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if c, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(c), home) {
			t.Errorf("process %s left: %s", e.Name(), strings.ReplaceAll(string(c), "\x00", " "))
		}
	}
}
