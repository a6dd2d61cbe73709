//go:build linux

package agent_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent"
	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/transport"
)

// startAgent serves the agent in this process on a unix socket, running
// commands on the host (root "/"): exec semantics without a VM.
func startAgent(t *testing.T) *client.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	g := agent.NewServer(agent.Config{Root: "/"}).Handle
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				if transport.GuestHandshake(c, agent.Version) == nil {
					transport.Serve(c, g)
				}
			}()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func run(t *testing.T, c *client.Client, spec client.Spec) (client.Exit, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	if spec.Env == nil {
		spec.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}
	p, err := c.Exec(context.Background(), spec, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return ex, out.String(), errb.String()
}

func TestExecStreamsAndExitCode(t *testing.T) {
	c := startAgent(t)
	ex, out, errs := run(t, c, client.Spec{Argv: []string{"sh", "-c", "echo a; echo b >&2; exit 3"}})
	if ex.Code != 3 || out != "a\n" || errs != "b\n" {
		t.Fatalf("got code %d stdout %q stderr %q", ex.Code, out, errs)
	}
}

func TestExecCommandNotFound(t *testing.T) {
	c := startAgent(t)
	ex, _, errs := run(t, c, client.Spec{Argv: []string{"no-such-command-xyz"}})
	if ex.Code != 127 || !strings.Contains(errs, "no-such-command-xyz: command not found") {
		t.Fatalf("got code %d stderr %q", ex.Code, errs)
	}
}

func TestExecBinaryOutputUnchanged(t *testing.T) {
	c := startAgent(t)
	_, out, _ := run(t, c, client.Spec{Argv: []string{"printf", `a\000b\377\376c`}})
	if out != "a\x00b\xff\xfec" {
		t.Fatalf("got %q", out)
	}
}

func TestExecTimeoutKillsTree(t *testing.T) {
	c := startAgent(t)
	start := time.Now()
	ex, out, _ := run(t, c, client.Spec{
		Argv:      []string{"sh", "-c", "sleep 600 & echo $!; sleep 600"},
		Timeout:   300 * time.Millisecond,
		KillGrace: 200 * time.Millisecond,
	})
	if !ex.TimedOut {
		t.Fatalf("not timed out: %+v", ex)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s", d)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("child pid %q: %v", out, err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	if alive(pid) {
		t.Fatalf("background child %d survived the timeout", pid)
	}
}

func TestExecBackgroundChildHoldingPipesDoesNotHang(t *testing.T) {
	c := startAgent(t)
	start := time.Now()
	ex, out, _ := run(t, c, client.Spec{Argv: []string{"sh", "-c", "sleep 5 & echo done"}})
	if ex.Code != 0 || out != "done\n" {
		t.Fatalf("got %+v %q", ex, out)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("exec waited for the background child: %s", d)
	}
}

func TestExecStdin(t *testing.T) {
	c := startAgent(t)
	var out bytes.Buffer
	p, err := c.Exec(context.Background(), client.Spec{Argv: []string{"cat"}, Stdin: true, Env: []string{"PATH=/usr/bin:/bin"}}, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.WriteStdin([]byte("hello "))
	p.WriteStdin([]byte("world"))
	p.CloseStdin()
	ex, err := p.Wait()
	if err != nil || ex.Code != 0 || out.String() != "hello world" {
		t.Fatalf("got %+v %v %q", ex, err, out.String())
	}
}

// slowCounter counts bytes and sleeps on each write, so the producer must
// wait for it.
type slowCounter struct{ n int64 }

func (s *slowCounter) Write(b []byte) (int, error) {
	s.n += int64(len(b))
	return len(b), nil
}

func TestExecLargeOutputBoundedMemory(t *testing.T) {
	c := startAgent(t)
	var before, peak runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w := &slowCounter{}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	var maxHeap uint64
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				runtime.ReadMemStats(&peak)
				if peak.HeapInuse > maxHeap {
					maxHeap = peak.HeapInuse
				}
			}
		}
	}()
	const total = 200 << 20
	p, err := c.Exec(context.Background(), client.Spec{Argv: []string{"head", "-c", "209715200", "/dev/zero"}, Env: []string{"PATH=/usr/bin:/bin"}}, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := p.Wait()
	close(stop)
	<-sampled
	if err != nil || ex.Code != 0 {
		t.Fatal(ex, err)
	}
	if w.n != total {
		t.Fatalf("got %d bytes, want %d", w.n, total)
	}
	if grow := int64(maxHeap) - int64(before.HeapInuse); grow > 64<<20 {
		t.Fatalf("heap grew by %d MiB while streaming 200 MiB", grow>>20)
	}
}

func TestConcurrentExecs(t *testing.T) {
	c := startAgent(t)
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func(i int) {
			var out bytes.Buffer
			p, err := c.Exec(context.Background(), client.Spec{Argv: []string{"sh", "-c", "sleep 0.2; echo $0", string(rune('a' + i))}, Env: []string{"PATH=/usr/bin:/bin"}}, &out, nil)
			if err != nil {
				errs <- err
				return
			}
			if _, err := p.Wait(); err != nil {
				errs <- err
				return
			}
			if out.String() != string(rune('a'+i))+"\n" {
				errs <- &mismatch{out.String()}
				return
			}
			errs <- nil
		}(i)
	}
	for i := 0; i < 8; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

type mismatch struct{ s string }

func (m *mismatch) Error() string { return "unexpected output " + m.s }

// A process an exec leaves running in the background outlives the exec,
// as with docker exec: neither the end of the call nor the host closing
// its connection afterwards may kill it.
func TestBackgroundProcessSurvivesExecEnd(t *testing.T) {
	c := startAgent(t)
	ex, out, _ := run(t, c, client.Spec{
		Argv:      []string{"sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"},
		KillGrace: 100 * time.Millisecond,
	})
	if ex.Code != 0 {
		t.Fatalf("exit %+v", ex)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("pid %q: %v", out, err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	c.Close()                          // the host goes away too (a CLI exits)
	time.Sleep(500 * time.Millisecond) // well past the kill grace
	if !alive(pid) {
		t.Fatalf("background process %d was killed after the exec ended", pid)
	}
}

// alive reports whether pid runs. A killed process may linger as a zombie
// until its new parent reaps it: look at its state, not just its existence.
func alive(pid int) bool {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	f := strings.Fields(string(st))
	return err == nil && len(f) >= 3 && f[2] != "Z"
}

// Every exec's goroutines end with it.
func TestExecLeavesNoGoroutines(t *testing.T) {
	c := startAgent(t)
	run(t, c, client.Spec{Argv: []string{"true"}})
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	for i := 0; i < 20; i++ {
		run(t, c, client.Spec{Argv: []string{"true"}})
	}
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before+5 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+5 {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines grew from %d to %d over 20 execs:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// blockingWriter takes the first write and then blocks until released: a
// caller that stopped reading an exec's output.
type blockingWriter struct {
	first   chan []byte
	release chan struct{}
}

func (w *blockingWriter) Write(b []byte) (int, error) {
	select {
	case w.first <- append([]byte(nil), b...):
	default:
	}
	<-w.release
	return len(b), nil
}

// Cancelling an exec's context kills its process tree, also while the
// caller has stopped reading the output (the agent's sends are then blocked
// on a full window), and leaves no goroutine behind in the agent.
func TestExecCancelKillsTree(t *testing.T) {
	for _, reading := range []bool{true, false} {
		t.Run(map[bool]string{true: "reading", false: "not_reading"}[reading], func(t *testing.T) {
			c := startAgent(t)
			run(t, c, client.Spec{Argv: []string{"true"}})
			time.Sleep(100 * time.Millisecond)
			before := runtime.NumGoroutine()
			ctx, cancel := context.WithCancel(context.Background())
			w := &blockingWriter{first: make(chan []byte, 1), release: make(chan struct{})}
			var out io.Writer = w
			// The child prints its pid, then (not reading) floods stdout.
			script := "sleep 600 & echo $!; " +
				map[bool]string{true: "sleep 600", false: "cat /dev/zero"}[reading]
			if reading {
				close(w.release)
			}
			p, err := c.Exec(ctx, client.Spec{Argv: []string{"sh", "-c", script},
				Env: []string{"PATH=/usr/bin:/bin"}, KillGrace: 200 * time.Millisecond}, out, nil)
			if err != nil {
				t.Fatal(err)
			}
			first := <-w.first
			pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(first), "\n", 2)[0]))
			if err != nil {
				t.Fatalf("child pid in %q: %v", first, err)
			}
			defer syscall.Kill(pid, syscall.SIGKILL)
			if !reading {
				time.Sleep(300 * time.Millisecond) // let the window fill up
			}
			if !alive(pid) {
				t.Fatalf("child %d is not running before the cancel", pid)
			}
			cancel()
			if !reading {
				close(w.release)
			}
			select {
			case <-p.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("Wait did not return after cancel")
			}
			if _, err := p.Wait(); !errors.Is(err, context.Canceled) {
				t.Fatalf("Wait after cancel: %v, want context.Canceled", err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for alive(pid) {
				if time.Now().After(deadline) {
					t.Fatalf("child %d still runs 5 s after cancel", pid)
				}
				time.Sleep(50 * time.Millisecond)
			}
			// The connection still works, and the call's goroutines ended.
			if ex, out, _ := run(t, c, client.Spec{Argv: []string{"echo", "ok"}}); ex.Code != 0 || out != "ok\n" {
				t.Fatalf("exec after cancel: %+v %q", ex, out)
			}
			for runtime.NumGoroutine() > before+5 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > before+5 {
				buf := make([]byte, 1<<20)
				t.Fatalf("goroutines grew from %d to %d:\n%s", before, n, buf[:runtime.Stack(buf, true)])
			}
		})
	}
}

// A call the agent does not know fails with the agent's message, and an
// exec without a command fails cleanly; the connection stays usable.
func TestCallErrors(t *testing.T) {
	c := startAgent(t)
	p, err := c.Exec(context.Background(), client.Spec{}, nil, nil)
	if err == nil {
		_, err = p.Wait()
	}
	if err == nil || !strings.Contains(err.Error(), "empty command") {
		t.Fatalf("exec without argv: %v", err)
	}
	if info, err := c.Hello(context.Background()); err != nil || info.Version != agent.Version {
		t.Fatalf("hello after a failed call: %+v %v", info, err)
	}
}
