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

// TestServePool: `airlock serve --pool python:slim=2 --max-boxes 2` fills
// its pool; a box created through the API comes from it (its first
// context is the kernel parked in the pool's template), the list shows
// only that box, GET /v1/pools and `airlock system df -v` show the pool's
// other box; the pool does not refill past --max-boxes (a claim counts
// once: a second create is a claim too, a third is refused); after
// SIGTERM nothing of the home runs.
func TestServePool(t *testing.T) {
	vmtest.Require(t)
	home := t.TempDir()
	dir, _ := os.MkdirTemp("", "airlock-serve-")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "a.sock")
	srv := exec.Command(airlockBin, "serve", "--pool", vmtest.DefaultImage+"=2", "--max-boxes", "2")
	env := append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+vmtest.ImagesDir(), "AIRLOCK_SOCKET="+sock, "AIRLOCK_URL=")
	srv.Env = env
	se, _ := srv.StderrPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	// A test that fails midway still ends serve as a user would (its pool
	// boxes go with it), and then whatever of its home still runs.
	t.Cleanup(func() {
		srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			srv.Process.Kill()
		}
		vmtest.KillHome(home)
	})
	logs := readLines(se)
	logs.waitFor(t, regexp.MustCompile(`warm pool ready`))
	uc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	status := func(method, path, body string, out any) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://airlock"+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := uc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 300 {
			return resp.StatusCode
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode
	}
	do := func(method, path, body string, out any) {
		t.Helper()
		if code := status(method, path, body, out); code >= 300 {
			t.Fatalf("%s %s: %d", method, path, code)
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
	var pools struct {
		Pools []struct {
			Size, Ready, Claimed int
			Boxes                []string
			HeldBack             string `json:"held_back"`
		}
	}
	do("GET", "/v1/pools", "", &pools)
	if len(pools.Pools) != 1 || pools.Pools[0].Ready != 1 || len(pools.Pools[0].Boxes) != 1 || pools.Pools[0].Claimed != 1 ||
		!strings.Contains(pools.Pools[0].HeldBack, "--max-boxes") {
		t.Fatalf("GET /v1/pools after a claim at --max-boxes 2: %+v, want 1 ready, held back", pools)
	}
	df := exec.Command(airlockBin, "system", "df", "-v")
	df.Env = env
	if out, err := df.CombinedOutput(); err != nil || !strings.Contains(string(out), pools.Pools[0].Boxes[0]) ||
		!regexp.MustCompile(`(?m)^Pool boxes\s+1\s+1\s`).Match(out) {
		t.Errorf("system df -v: %v\n%s\nwant the pool box %s", err, out, pools.Pools[0].Boxes[0])
	}
	// The second box is a claim (counted once), the third is refused.
	var box2 struct{ ID string }
	do("POST", "/v1/boxes", `{}`, &box2)
	if code := status("POST", "/v1/boxes", `{}`, nil); code != 403 {
		t.Errorf("a third box at --max-boxes 2: %d, want 403", code)
	}
	do("GET", "/v1/pools", "", &pools)
	if p := pools.Pools[0]; p.Ready != 0 || p.Claimed != 2 {
		t.Errorf("pool after the second claim: %+v, want 0 ready, 2 claimed", p)
	}
	do("DELETE", "/v1/boxes/"+box2.ID+"?force=true", "", nil)
	resp, err := uc.Get("http://airlock/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^airlock_pool_claims_total\{image="` + regexp.QuoteMeta(vmtest.DefaultImage) + `",key="[0-9a-f]+"\} 2$`).Match(mb) {
		t.Errorf("metrics do not count the claim:\n%s", mb)
	}
	if !regexp.MustCompile(`(?m)^airlock_pool_held_back\{image="` + regexp.QuoteMeta(vmtest.DefaultImage) + `",key="[0-9a-f]+"\} 1$`).Match(mb) {
		t.Errorf("metrics do not say the pool is held back by --max-boxes:\n%s", mb)
	}
	do("DELETE", "/v1/boxes/"+box.ID+"?force=true", "", nil)
	srv.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		if err != nil {
			t.Errorf("serve after SIGTERM: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("serve did not exit on SIGTERM")
	}
	for pid, cmd := range vmtest.HomeProcesses(home) {
		t.Errorf("process %d left: %s", pid, cmd)
	}
}
