package airlock_test

// The hostile-code battery: one test per attack a box's code can make on the
// host, each asserting that the host is unaffected, the error says what
// happened, and the output already produced is kept. Boxes are shared
// between attacks where one cannot disturb the next.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// hostRSS is this process's resident memory in bytes.
func hostRSS(t testing.TB) int64 { return procKiB(t, "/proc/self/status", "VmRSS") << 10 }

// peakRSS samples hostRSS every 10 ms until stop is called, which returns
// the largest value seen.
func peakRSS(t testing.TB) (stop func() int64) {
	done := make(chan struct{})
	res := make(chan int64)
	go func() {
		peak := hostRSS(t)
		for {
			select {
			case <-done:
				res <- peak
				return
			case <-time.After(10 * time.Millisecond):
				peak = max(peak, hostRSS(t))
			}
		}
	}()
	return func() int64 { close(done); return <-res }
}

// outputFlood runs a command printing size bytes through Exec and checks
// that the result keeps the head and tail, says it was truncated, and that
// this process's RSS grew by less than 64 MiB (the kept 16 MiB and its
// copies): the RSS it had before depends on the tests that ran before it in
// this process. It returns the time taken and the peak growth.
func outputFlood(t testing.TB, b *airlock.Box, size int64) (time.Duration, int64) {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	before := hostRSS(t)
	stop := peakRSS(t)
	t1 := time.Now()
	res, err := b.Exec(context.Background(), "sh", []string{"-c", fmt.Sprintf("printf HEAD; head -c %d /dev/zero; printf TAIL", size)}, airlock.ExecOptions{})
	peak := stop()
	d := time.Since(t1)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || !res.Truncated {
		t.Fatalf("exit %d truncated %v", res.ExitCode, res.Truncated)
	}
	if len(res.Stdout) != airlock.DefaultMaxOutput || res.StdoutDropped != size+8-airlock.DefaultMaxOutput {
		t.Fatalf("kept %d bytes, dropped %d", len(res.Stdout), res.StdoutDropped)
	}
	if !bytes.HasPrefix(res.Stdout, []byte("HEAD")) || !bytes.HasSuffix(res.Stdout, []byte("TAIL")) {
		t.Fatalf("head or tail lost: %q...%q", res.Stdout[:8], res.Stdout[len(res.Stdout)-8:])
	}
	if peak-before > 64<<20 {
		t.Fatalf("host RSS grew from %d MiB to %d MiB (limit: 64 MiB more)", before>>20, peak>>20)
	}
	t.Logf("host RSS: %d MiB before, %d MiB at the peak", before>>20, peak>>20)
	return d, peak - before
}

// BenchmarkExecOutputFlood prints 10 GiB through Exec (go test -bench
// ExecOutputFlood -benchtime 1x; minutes under TCG): the output is capped
// in the guest and host RSS grows by less than 64 MiB. It reports the peak
// growth.
func BenchmarkExecOutputFlood(bm *testing.B) {
	vmtest.Require(bm)
	r, err := airlock.Open(airlock.Options{Home: bm.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		bm.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled})
	if err != nil {
		bm.Fatal(err)
	}
	defer r.Remove(context.Background(), b.ID(), true)
	var peak int64
	bm.ResetTimer()
	for i := 0; i < bm.N; i++ {
		_, p := outputFlood(bm, b, 10<<30)
		peak = max(peak, p)
	}
	bm.ReportMetric(float64(peak>>20), "peak-RSS-growth-MiB")
}

func TestHostile(t *testing.T) {
	vmtest.Require(t)
	t0 := time.Now()
	r := openRuntime(t, "")
	ctx := context.Background()
	// A small writable layer, so that filling it is quick.
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled, DiskSizeMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })
	alive := func(t *testing.T) {
		t.Helper()
		res := exec(t, b, airlock.ExecOptions{Timeout: time.Minute}, "echo", "alive")
		if string(res.Stdout) != "alive\n" {
			t.Fatalf("box does not answer after the attack: %+v", res)
		}
	}

	t.Run("1 GiB of output through Exec", func(t *testing.T) {
		// About 17 s under TCG (the guest's pipe copies); the agent keeps
		// only the head and tail. BenchmarkExecOutputFlood runs 10 GiB.
		d, peak := outputFlood(t, b, 1<<30)
		t.Logf("1 GiB through Exec: %s; host RSS grew by %d MiB at most", d.Round(time.Millisecond), peak>>20)
	})

	t.Run("a raised MaxOutput keeps more", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{MaxOutput: 1000}, "sh", "-c", "head -c 5000 /dev/zero; echo err >&2")
		if len(res.Stdout) != 1000 || res.StdoutDropped != 4000 || string(res.Stderr) != "err\n" || !res.Truncated {
			t.Fatalf("kept %d, dropped %d, stderr %q", len(res.Stdout), res.StdoutDropped, res.Stderr)
		}
		res = exec(t, b, airlock.ExecOptions{MaxOutput: -1}, "head", "-c", "3000000", "/dev/zero")
		if len(res.Stdout) != 3000000 || res.Truncated {
			t.Fatalf("unlimited: kept %d, truncated %v", len(res.Stdout), res.Truncated)
		}
	})

	t.Run("fork bomb under a timeout", func(t *testing.T) {
		t1 := time.Now()
		// 10 s here; TestCLIRun runs one under `airlock run --timeout 20s`.
		res := exec(t, b, airlock.ExecOptions{Timeout: 10 * time.Second}, "sh", "-c", "echo start; f() { f | f & }; f; sleep 100")
		t.Logf("fork bomb ended after %s: exit %d, timed out %v", time.Since(t1).Round(time.Millisecond), res.ExitCode, res.TimedOut)
		if !res.TimedOut || !strings.HasPrefix(string(res.Stdout), "start\n") {
			t.Fatalf("fork bomb: %+v", res)
		}
		if b.Unhealthy() != "" {
			t.Fatalf("box marked unhealthy: %s", b.Unhealthy())
		}
		alive(t)
	})

	t.Run("64 threads fit the exec limits", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{Timeout: time.Minute}, "python3", "-c",
			"import threading, time\nts = [threading.Thread(target=time.sleep, args=(1,)) for _ in range(64)]\n[t.start() for t in ts]\n[t.join() for t in ts]\nprint(len(ts))")
		if res.ExitCode != 0 || string(res.Stdout) != "64\n" {
			t.Fatalf("64 threads: %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})

	t.Run("memory bomb", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{Timeout: 2 * time.Minute}, "python3", "-c",
			"import sys; print('start', flush=True); a = [b'x' * (32 << 20) for _ in range(64)]")
		if !res.OOMKilled || res.ExitCode != 137 || string(res.Stdout) != "start\n" {
			t.Fatalf("memory bomb: exit %d, OOMKilled %v, stdout %q, stderr %q", res.ExitCode, res.OOMKilled, res.Stdout, res.Stderr)
		}
		alive(t)
	})

	t.Run("disk fill", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{Timeout: 2 * time.Minute}, "sh", "-c", "dd if=/dev/zero of=/fill bs=1M 2>&1; sync; echo done")
		if !strings.Contains(string(res.Stdout), "No space left") || !strings.HasSuffix(string(res.Stdout), "done\n") {
			t.Fatalf("disk fill: %q", res.Stdout)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(filepath.Dir(b.ConsoleLog()), "rw.ext4"), &st); err != nil {
			t.Fatal(err)
		}
		if used := st.Blocks * 512; used > 140<<20 {
			t.Fatalf("writable layer uses %d MiB on the host (size 128 MiB)", used>>20)
		}
		exec(t, b, airlock.ExecOptions{}, "rm", "/fill")
		alive(t)
	})

	t.Run("20 concurrent execs", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := b.Exec(ctx, "sh", []string{"-c", fmt.Sprintf("sleep 1; echo %d", i)}, airlock.ExecOptions{Timeout: 2 * time.Minute})
				if err != nil {
					errs <- err
				} else if string(res.Stdout) != fmt.Sprintf("%d\n", i) {
					errs <- fmt.Errorf("exec %d: %q", i, res.Stdout)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("bad inputs", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{}, "no-such-command")
		if res.ExitCode != 127 || !strings.Contains(string(res.Stderr), "not found") {
			t.Errorf("missing command: %+v", res)
		}
		res = exec(t, b, airlock.ExecOptions{WorkingDir: "/no/such/dir"}, "true")
		if res.ExitCode != 126 || !strings.Contains(string(res.Stderr), "does not exist") {
			t.Errorf("missing working dir: %d %q", res.ExitCode, res.Stderr)
		}
		res = exec(t, b, airlock.ExecOptions{Env: []string{"BIG=" + strings.Repeat("x", 3<<20)}}, "true")
		if res.ExitCode != 126 || !strings.Contains(string(res.Stderr), "argument list too long") {
			t.Errorf("huge env: %d %q", res.ExitCode, res.Stderr)
		}
		res = exec(t, b, airlock.ExecOptions{}, "echo", "a\x00b")
		if res.ExitCode != 126 || !strings.Contains(string(res.Stderr), "invalid argument") {
			t.Errorf("NUL in argv: %d %q", res.ExitCode, res.Stderr)
		}
		res = exec(t, b, airlock.ExecOptions{Env: []string{"BIN=\xff\xfe"}}, "sh", "-c", `printf %s "$BIN"`)
		if res.ExitCode != 0 || string(res.Stdout) != "\xff\xfe" {
			t.Errorf("non-UTF-8 env: %d %q", res.ExitCode, res.Stdout)
		}
		// No network here: a registry on a closed loopback port.
		_, err := r.Create(ctx, airlock.BoxOptions{Image: "127.0.0.1:1/no/such:image"})
		if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1/no/such:image") {
			t.Errorf("unknown image: %v", err)
		}
		alive(t)
	})

	t.Run("frozen VM mid-exec", func(t *testing.T) {
		info, err := b.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p, err := b.ExecStream(ctx, "sh", []string{"-c", "echo started; sleep 600"}, airlock.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 8)
		if _, err := p.Stdout().Read(line); err != nil {
			t.Fatal(err)
		}
		syscall.Kill(info.PID, syscall.SIGSTOP)
		t1 := time.Now()
		_, err = p.Wait()
		took := time.Since(t1)
		syscall.Kill(info.PID, syscall.SIGCONT)
		t.Logf("frozen VM noticed after %s: %v", took.Round(time.Millisecond), err)
		if err == nil || !strings.Contains(err.Error(), "stopped answering") {
			t.Fatalf("exec on a frozen VM: %v", err)
		}
		// Keepalive's 2 s + 8 s and a QMP question of 1.5 s, with room
		// for a loaded host.
		if took > 20*time.Second {
			t.Fatalf("frozen VM noticed after %s", took)
		}
		alive(t)
	})
	t.Logf("shared-box attacks took %s", time.Since(t0).Round(time.Millisecond))
}

// The guest agent's exec handler wedged (a test-only fault): the host's own
// timer ends the call with TimedOut and the output that arrived, and marks
// the box unhealthy. Then QEMU is killed mid-exec: the call fails at once
// with ErrBoxDied and the output so far is kept.
func TestHostileWedgedAgentAndKilledVM(t *testing.T) {
	vmtest.Require(t)
	airlock.RequireTestFaults(t)
	t0 := time.Now()
	r, err := airlock.OpenWedgedQEMU(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })

	res := exec(t, b, airlock.ExecOptions{Timeout: time.Second, KillGrace: 100 * time.Millisecond}, "sh", "-c", "echo before; sleep 600")
	if !res.TimedOut || string(res.Stdout) != "before\n" || !strings.Contains(res.ErrorMessage, "unhealthy") {
		t.Fatalf("wedged exec (is the agent built with -tags airlock_testfaults? vmtest.BuildAgent does so in such builds): %+v", res)
	}
	if b.Unhealthy() == "" {
		t.Fatal("box not marked unhealthy")
	}
	t.Logf("wedged exec returned after %s: %s", res.Duration.Round(time.Millisecond), res.ErrorMessage)

	info, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var execRes *airlock.ExecResult
	var execErr error
	go func() {
		defer close(done)
		execRes, execErr = b.Exec(ctx, "sh", []string{"-c", "echo partial; sleep 600"}, airlock.ExecOptions{})
	}()
	time.Sleep(2 * time.Second) // let "partial" arrive
	syscall.Kill(info.PID, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("exec still pending 15 s after QEMU was killed")
	}
	if !errors.Is(execErr, airlock.ErrBoxDied) {
		t.Fatalf("exec after kill -9 of QEMU: %v", execErr)
	}
	if execRes == nil || string(execRes.Stdout) != "partial\n" {
		t.Fatalf("output before the kill lost: %+v", execRes)
	}
	t.Logf("wedge and kill took %s", time.Since(t0).Round(time.Millisecond))
}
