package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

// lineReader hands a process's output to the test line by line.
type lineReader struct {
	lines chan string
}

func readLines(r io.Reader) *lineReader {
	l := &lineReader{lines: make(chan string, 1000)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l.lines <- sc.Text()
		}
		close(l.lines)
	}()
	return l
}

func (l *lineReader) waitFor(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				t.Fatalf("output ended before a line matching %s", re)
			}
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-deadline:
			t.Fatalf("no line matching %s", re)
		}
	}
}

// TestServeAndEvents runs `airlock serve` (unix socket and TCP with a
// token) and `airlock events` as processes: a box created and removed
// through the socket shows up in the event stream, TCP wants the token,
// and SIGTERM ends the server cleanly.
func TestServeAndEvents(t *testing.T) {
	vmtest.Require(t)
	home := t.TempDir()
	dir, _ := os.MkdirTemp("", "airlock-serve-")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "a.sock")
	env := append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+vmtest.ImagesDir(), "AIRLOCK_SOCKET="+sock, "AIRLOCK_URL=")

	srv := exec.Command(airlockBin, "serve", "--listen", "127.0.0.1:0", "--token", "s3cret")
	srv.Env = env
	se, _ := srv.StderrPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	t.Cleanup(func() { vmtest.KillHome(home) }) // after a failure midway
	logs := readLines(se)
	addr := logs.waitFor(t, regexp.MustCompile(`tcp=(127\.0\.0\.1:\d+)`))[1]
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi, err)
	}

	ev := exec.Command(airlockBin, "events")
	ev.Env = env
	eo, _ := ev.StdoutPipe()
	ee, _ := ev.StderrPipe()
	if err := ev.Start(); err != nil {
		t.Fatal(err)
	}
	defer ev.Process.Kill()
	events := readLines(eo)
	readLines(ee).waitFor(t, regexp.MustCompile(`following the events of `+regexp.QuoteMeta(sock)))

	uc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := uc.Post("http://airlock/v1/boxes", "application/json", strings.NewReader(`{"network":"disabled"}`))
	if err != nil {
		t.Fatal(err)
	}
	var box struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&box)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	events.waitFor(t, regexp.MustCompile(`box\.created\s+`+box.ID))
	req, _ := http.NewRequest("DELETE", "http://airlock/v1/boxes/"+box.ID+"?force=true", nil)
	if resp, err := uc.Do(req); err != nil || resp.StatusCode != 204 {
		t.Fatalf("remove: %v %v", resp, err)
	}
	events.waitFor(t, regexp.MustCompile(`box\.removed\s+`+box.ID+` \(removed\)`))

	for _, tc := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer nope", 401}, {"Bearer s3cret", 200}} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/boxes", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("TCP with %q: %d, want %d", tc.auth, resp.StatusCode, tc.want)
		}
	}

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
	if _, err := os.Stat(sock); err == nil {
		t.Error("socket left behind")
	}
	ev.Wait() // the stream ended with the server
}

func TestPrintOpenAPIMatchesCommitted(t *testing.T) {
	out, err := exec.Command(airlockBin, "serve", "--print-openapi").Output()
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join("..", "..", "api", "openapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, committed) {
		t.Error("airlock serve --print-openapi differs from api/openapi.json: regenerate it")
	}
}

// A server an SDK started on demand (--idle-exit) gives way to one the user
// starts on the same socket; a server the user started does not, and the
// error names its pid and how to stop it.
func TestServeReplacesOnDemandServer(t *testing.T) {
	home := t.TempDir()
	dir, _ := os.MkdirTemp("", "airlock-serve-")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "a.sock")
	env := append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+t.TempDir(), "AIRLOCK_URL=")
	start := func(args ...string) (*exec.Cmd, *lineReader) {
		c := exec.Command(airlockBin, append([]string{"serve", "--socket", sock}, args...)...)
		c.Env = env
		se, _ := c.StderrPipe()
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c, readLines(se)
	}
	listening := regexp.MustCompile(`listening.*socket=`)
	sdk, sdkLog := start("--idle-exit", "10m")
	sdkLog.waitFor(t, listening)
	exited := make(chan error, 1)
	go func() { exited <- sdk.Wait() }()

	user, userLog := start()
	userLog.waitFor(t, listening)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the on-demand server still runs 20 s after the user's took its socket")
	}

	other := exec.Command(airlockBin, "serve", "--socket", sock)
	other.Env = env
	out, err := other.CombinedOutput()
	want := fmt.Sprintf("(pid %d) is listening on %s: stop it (kill %d", user.Process.Pid, sock, user.Process.Pid)
	if err == nil || !strings.Contains(string(out), want) {
		t.Fatalf("a second server on the user's socket: %v %s, want an error with %q", err, out, want)
	}
}
