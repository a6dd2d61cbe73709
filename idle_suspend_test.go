package airlock_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// liveQEMUs counts the live QEMU processes of box id (a zombie, which
// holds no memory, is not one).
func liveQEMUs(t *testing.T, id string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	n := 0
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(raw), "qemu") || !strings.Contains(string(raw), id) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) STATE ...: the state follows the last ')'.
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] != "Z" && f[0] != "X" {
			n++
		}
	}
	return n
}

// waitSuspended polls b until its idle timeout has suspended it
// (bounded: 2 min, for a loaded host running TCG).
func waitSuspended(t *testing.T, b *airlock.Box) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		info, err := b.Info(context.Background())
		if err == nil && info.State == airlock.BoxStopped && info.Suspended {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("box %s: not suspended by its idle timeout within 2 min: %+v %v", b.ID(), info, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestIdleSuspendQEMU: scale to zero. A box with an idle timeout and
// IdleSuspend, running python3 -m http.server on a published port, is
// suspended once idle: no live QEMU is left. An exec resumes it, and the
// server process kept its pid; suspended again, an HTTP GET from the
// host to its published port (held while the box resumes, not refused)
// wakes it and is answered by the box.
func TestIdleSuspendQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	r := openRuntime(t, "")
	b, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage, IdleTimeout: 3 * time.Second,
		IdleAction: airlock.IdleSuspend, Ports: []airlock.PortMapping{{GuestPort: 8000}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	pid := shIn(t, b, "mkdir -p /srv && echo hello from the box > /srv/index.html && cd /srv && { nohup python3 -m http.server 8000 >/dev/null 2>&1 & echo $!; }")
	// Serving before the first suspend (the box's own check: no host
	// traffic, which would count as use).
	shIn(t, b, `for i in $(seq 300); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8000/", timeout=5)' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`)
	ports, err := b.Ports(ctx)
	if err != nil || len(ports) != 1 || ports[0].HostPort == 0 {
		t.Fatalf("ports %+v, %v", ports, err)
	}
	if n := liveQEMUs(t, b.ID()); n != 1 {
		t.Fatalf("running box: %d live QEMU processes, want 1", n)
	}

	waitSuspended(t, b)
	if n := liveQEMUs(t, b.ID()); n != 0 {
		t.Fatalf("suspended box: %d live QEMU processes, want 0", n)
	}
	// An exec resumes it; the server runs on with its pid.
	if got := shIn(t, b, "cat /proc/"+pid+"/cmdline | tr '\\0' ' '"); !strings.Contains(got, "http.server") {
		t.Errorf("after the resume, pid %s is %q, want the http.server started before the suspend", pid, got)
	}
	if info, err := b.Info(ctx); err != nil || info.State != airlock.BoxRunning || info.Suspended {
		t.Fatalf("after an exec: %+v %v, want running", info, err)
	}

	// Suspended again, an inbound connection wakes it and is served.
	waitSuspended(t, b)
	if n := liveQEMUs(t, b.ID()); n != 0 {
		t.Fatalf("suspended again: %d live QEMU processes, want 0", n)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", ports[0].HostPort)
	hc := &http.Client{Timeout: 2 * time.Minute}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s on the suspended box: %v", url, err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if string(body) != "hello from the box\n" {
		t.Errorf("GET %s: %d %q", url, resp.StatusCode, body)
	}
	if n := liveQEMUs(t, b.ID()); n != 1 {
		t.Errorf("woken box: %d live QEMU processes, want 1", n)
	}
}
