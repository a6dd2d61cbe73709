package airlock_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestCheckpointQEMU: a rollback returns a running box, in place, to a
// checkpoint's files, processes and memory. At A a file says a and a
// background process holds a value in memory; at B the file says b and
// another process runs. Rollback to A: the file says a, B's process is
// gone, A's process answers with its value, the box keeps its id, name
// and published port, through which a server of A's answers. Rollback to B: all of B is back. A checkpoint
// taken after rolling back to A is a child of A (a branch).
func TestCheckpointQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	r := openRuntime(t, "")
	b, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage, Name: "ckq", Ports: []airlock.PortMapping{{GuestPort: 8000}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	before, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ports, err := b.Ports(ctx)
	if err != nil || len(ports) != 1 || ports[0].HostPort == 0 {
		t.Fatalf("ports %+v %v", ports, err)
	}
	shIn(t, b, "echo a > /root/f")
	drawn := shIn(t, b, holder)
	shIn(t, b, "cd /root && setsid python3 -m http.server 8000 </dev/null >/dev/null 2>&1 &")
	get := func() string {
		// Bounded polling: the server may take seconds to listen under
		// TCG, and the host port answers once the helper is up.
		url := fmt.Sprintf("http://127.0.0.1:%d/f", ports[0].HostPort)
		var last error
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
			if err != nil {
				last = err
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return strings.TrimSpace(string(body))
		}
		t.Fatalf("GET %s: %v", url, last)
		return ""
	}
	if got := get(); got != "a" {
		t.Fatalf("the published server answers %q before the checkpoint", got)
	}
	if _, err := b.Checkpoint(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	shIn(t, b, "echo b > /root/f")
	bg := shIn(t, b, "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!")
	if _, err := b.Checkpoint(ctx, "B"); err != nil {
		t.Fatal(err)
	}
	alive := func() bool {
		// The pid may be the shell's own after the rollback (its pid
		// counter is A's): the command line tells them apart.
		return shIn(t, b, "tr '\\0' ' ' </proc/"+bg+"/cmdline 2>/dev/null; true") == "sleep 1000"
	}

	t0 := time.Now()
	if err := b.Rollback(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	t.Logf("rollback took %s", time.Since(t0).Round(time.Millisecond))
	if got := shIn(t, b, "cat /root/f"); got != "a" {
		t.Errorf("after rollback A the file says %q, want a", got)
	}
	if alive() {
		t.Errorf("after rollback A the process started after A (pid %s) runs", bg)
	}
	if got := askHolder(t, b); got != drawn {
		t.Errorf("after rollback A the process of A answers %q, want %q (its memory)", got, drawn)
	}
	after, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.ID != before.ID || after.Name != "ckq" || after.State != airlock.BoxRunning {
		t.Errorf("after rollback: id %s name %s state %s; before: id %s", after.ID, after.Name, after.State, before.ID)
	}
	// The host port picked at the start is bound again, and reaches a
	// server of A's.
	if now, err := b.Ports(ctx); err != nil || len(now) != 1 || now[0] != ports[0] {
		t.Errorf("ports after rollback %+v %v, want %+v", now, err, ports)
	}
	if got := get(); got != "a" {
		t.Errorf("the server of A, through the published port, answers %q after rollback A, want a", got)
	}

	// A branch: C's parent is A.
	shIn(t, b, "echo c > /root/f")
	if c, err := b.Checkpoint(ctx, "C"); err != nil || c.Parent != "A" {
		t.Fatalf("checkpoint C after rollback A: %+v %v, want parent A", c, err)
	}
	if err := b.Rollback(ctx, "B"); err != nil {
		t.Fatal(err)
	}
	if got := shIn(t, b, "cat /root/f"); got != "b" {
		t.Errorf("after rollback B the file says %q, want b", got)
	}
	if !alive() {
		t.Errorf("after rollback B its process (pid %s) is gone", bg)
	}
	list, err := b.Checkpoints()
	if err != nil {
		t.Fatal(err)
	}
	var tree []string
	for _, c := range list {
		tree = append(tree, c.Name+"<"+c.Parent+" current="+strconv.FormatBool(c.Current))
	}
	if got := strings.Join(tree, ", "); got != "A< current=false, B<A current=true, C<A current=false" {
		t.Errorf("tree: %s", got)
	}
}

// stepHolder starts a Python process marked n that keeps a random value
// in its memory (written to /root/ans<n> on SIGUSR1) and returns it.
func stepHolder(t *testing.T, b *airlock.Box, n int) string {
	t.Helper()
	return shIn(t, b, fmt.Sprintf(`setsid python3 -c '
import os, signal, sys, time
v = os.urandom(8).hex()
signal.signal(signal.SIGUSR1, lambda *a: open("/root/ans" + sys.argv[1], "w").write(v))
open("/root/drawn" + sys.argv[1], "w").write(v)
while True: time.sleep(1)
' %[1]d </dev/null >/dev/null 2>&1 &
echo $! > /root/p%[1]d.pid
while [ ! -s /root/drawn%[1]d ]; do sleep 0.05; done; cat /root/drawn%[1]d`, n))
}

// askStep returns what holder n answers ("" when it does not run).
func askStep(t *testing.T, b *airlock.Box, n int) string {
	t.Helper()
	return shIn(t, b, fmt.Sprintf(`rm -f /root/ans%[1]d; kill -USR1 "$(cat /root/p%[1]d.pid 2>/dev/null)" 2>/dev/null || exit 0
for i in $(seq 200); do [ -s /root/ans%[1]d ] && break; sleep 0.05; done; cat /root/ans%[1]d`, n))
}

// TestCheckpointChainQEMU: checkpoints after the first store what changed
// (each takes less disk than the first), and every one restores exactly
// whatever chain it sits on: at each of C0..C3 a file says the step, a
// new process holds a value in memory and 2 MiB are written. Rollback to
// C1, two deltas back: the file says 1, C1's process answers its value,
// C2's does not run. Removing C2, in the middle of the chain, leaves C3
// restorable: rollback C3 brings back the file and C2's and C3's
// processes with their values. Fork from checkpoint C3 starts a box as at
// C3, while the box itself runs on as it is.
func TestCheckpointChainQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	r := openRuntime(t, "")
	b, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage, Network: airlock.NetworkNone})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	drawn := map[int]string{}
	var sizes []int64
	for i := 0; i < 4; i++ {
		shIn(t, b, fmt.Sprintf("echo %d > /root/v; head -c 2M /dev/urandom > /root/r%d", i, i))
		drawn[i] = stepHolder(t, b, i)
		c, err := b.Checkpoint(ctx, fmt.Sprintf("C%d", i))
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, c.StateBytes+c.DiskBytes)
	}
	for i, s := range sizes[1:] {
		if s >= sizes[0] {
			t.Errorf("checkpoint C%d takes %d bytes, the first %d: a checkpoint after the first stores what changed", i+1, s, sizes[0])
		}
	}
	t.Logf("checkpoint sizes: %v", sizes)
	check := func(at int, running ...int) {
		t.Helper()
		if got := shIn(t, b, "cat /root/v"); got != strconv.Itoa(at) {
			t.Errorf("at C%d the file says %q", at, got)
		}
		for i := 0; i < 4; i++ {
			want := ""
			for _, r := range running {
				if r == i {
					want = drawn[i]
				}
			}
			if got := askStep(t, b, i); got != want {
				t.Errorf("at C%d process %d answers %q, want %q", at, i, got, want)
			}
		}
	}
	if err := b.Rollback(ctx, "C1"); err != nil {
		t.Fatal(err)
	}
	check(1, 0, 1)
	if err := b.RemoveCheckpoint(ctx, "C2"); err != nil {
		t.Fatal(err)
	}
	if err := b.Rollback(ctx, "C3"); err != nil {
		t.Fatal(err)
	}
	check(3, 0, 1, 2, 3)
	shIn(t, b, "echo after > /root/v")
	kids, err := b.Fork(ctx, 1, airlock.ForkOptions{FromCheckpoint: "C3"})
	if err != nil {
		t.Fatal(err)
	}
	k := kids[0]
	t.Cleanup(func() { k.Remove(context.Background(), true) })
	if got := shIn(t, k, "cat /root/v"); got != "3" {
		t.Errorf("the box forked from C3 has the file saying %q, want 3", got)
	}
	if got := askStep(t, k, 3); got != drawn[3] {
		t.Errorf("in the box forked from C3 process 3 answers %q, want %q", got, drawn[3])
	}
	if got := shIn(t, b, "cat /root/v"); got != "after" {
		t.Errorf("the forked box's own file says %q after the fork, want after", got)
	}
}
