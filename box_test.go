package airlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/cli"
	"github.com/airlock-run/airlock/internal/vmtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(asCLIEnv) == "1" { // this binary as the airlock CLI (kubenode_kill_test.go)
		os.Exit(cli.Main(os.Args[1:]))
	}
	os.Exit(vmtest.Main(m))
}

// openRuntime opens a runtime on a fresh home that shares the image store
// and cache with the machine's default ones.
func openRuntime(t *testing.T, home string) *airlock.Runtime {
	t.Helper()
	if home == "" {
		home = t.TempDir()
	}
	// The shared store, read only; where there is none, an empty one of
	// the test's (opening a store creates it).
	images := vmtest.ImagesDir()
	if _, err := os.Stat(filepath.Join(images, "index.json")); err != nil {
		images = t.TempDir()
	}
	r, err := airlock.Open(airlock.Options{Home: home, ImagesDir: images, Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func exec(t *testing.T, b *airlock.Box, opts airlock.ExecOptions, cmd string, args ...string) *airlock.ExecResult {
	t.Helper()
	res, err := b.Exec(context.Background(), cmd, args, opts)
	if err != nil {
		t.Fatalf("exec %s %q: %v", cmd, args, err)
	}
	return res
}

func TestBox(t *testing.T) {
	vmtest.Require(t)
	home := t.TempDir()
	r := openRuntime(t, home)
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Name: "lifecycle", Env: []string{"BOXVAR=fromBox"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })

	t.Run("python", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{}, "python3", "-c", "print(sum(range(10)))")
		if res.ExitCode != 0 || string(res.Stdout) != "45\n" {
			t.Fatalf("got %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		res = exec(t, b, airlock.ExecOptions{}, "sh", "-c", "for c in python python3 pip; do command -v $c; done; ls /usr/local/bin/python")
		for _, want := range []string{"python\n", "python3\n", "pip\n", "/usr/local/bin/python\n"} {
			if !strings.Contains(string(res.Stdout), want) {
				t.Errorf("missing %q in %q", want, res.Stdout)
			}
		}
	})
	t.Run("streams and exit code", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", "echo a; echo b >&2; exit 3")
		if res.ExitCode != 3 || string(res.Stdout) != "a\n" || string(res.Stderr) != "b\n" {
			t.Fatalf("got %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("command not found", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{}, "definitely-not-a-command")
		if res.ExitCode != 127 || !strings.Contains(string(res.Stderr), "not found") {
			t.Fatalf("got %d %q", res.ExitCode, res.Stderr)
		}
	})
	t.Run("binary output", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{}, "python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))")
		want := make([]byte, 256)
		for i := range want {
			want[i] = byte(i)
		}
		if !bytes.Equal(res.Stdout, want) {
			t.Fatalf("got %q", res.Stdout)
		}
	})
	t.Run("env user workdir", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{Env: []string{"EXECVAR=x"}, User: "nobody", WorkingDir: "/tmp"},
			"sh", "-c", `echo "$BOXVAR $EXECVAR $(id -u) $(pwd)"`)
		if got := strings.TrimSpace(string(res.Stdout)); got != "fromBox x 65534 /tmp" {
			t.Fatalf("got %q (stderr %q)", got, res.Stderr)
		}
	})
	t.Run("timeout kills the tree", func(t *testing.T) {
		start := time.Now()
		res := exec(t, b, airlock.ExecOptions{Timeout: time.Second}, "sh", "-c", "sleep 600 & sleep 600")
		if !res.TimedOut {
			t.Fatalf("not timed out: %+v", res)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("timeout took %s", d)
		}
		left := exec(t, b, airlock.ExecOptions{}, "pgrep", "-x", "sleep")
		if len(bytes.TrimSpace(left.Stdout)) != 0 {
			t.Fatalf("processes left behind: %q", left.Stdout)
		}
	})
	t.Run("context deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		res, err := b.Exec(ctx, "sh", []string{"-c", "echo before; setsid sleep 600 & sleep 600"}, airlock.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut || string(res.Stdout) != "before\n" {
			t.Fatalf("got %+v %q", res, res.Stdout)
		}
		left := exec(t, b, airlock.ExecOptions{}, "pgrep", "-x", "sleep")
		if len(bytes.TrimSpace(left.Stdout)) != 0 {
			t.Fatalf("setsid child survived: %q", left.Stdout)
		}
	})
	t.Run("concurrent execs", func(t *testing.T) {
		errs := make(chan error, 4)
		for i := 0; i < 4; i++ {
			go func(i int) {
				res, err := b.Exec(ctx, "sh", []string{"-c", fmt.Sprintf("sleep 0.5; echo %d", i)}, airlock.ExecOptions{})
				if err == nil && string(res.Stdout) != fmt.Sprintf("%d\n", i) {
					err = fmt.Errorf("exec %d got %q", i, res.Stdout)
				}
				errs <- err
			}(i)
		}
		for i := 0; i < 4; i++ {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("streaming stdin and large output", func(t *testing.T) {
		p, err := b.ExecStream(ctx, "cat", nil, airlock.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(p.Stdin(), "ping")
		p.Stdin().Close()
		out, _ := io.ReadAll(p.Stdout())
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 || string(out) != "ping" {
			t.Fatalf("got %v %v %q", res, err, out)
		}

		const total = 64 << 20
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		p, err = b.ExecStream(ctx, "head", []string{"-c", fmt.Sprint(total), "/dev/zero"}, airlock.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		var maxHeap uint64
		buf := make([]byte, 64<<10)
		for {
			k, err := p.Stdout().Read(buf)
			n += int64(k)
			if n%(8<<20) < int64(k) {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				maxHeap = max(maxHeap, ms.HeapInuse)
				time.Sleep(50 * time.Millisecond) // a slow reader
			}
			if err != nil {
				break
			}
		}
		res, err := p.Wait()
		if err != nil || res.ExitCode != 0 || n != total {
			t.Fatalf("got %v %v, %d bytes", res, err, n)
		}
		if grow := int64(maxHeap) - int64(before.HeapInuse); grow > 32<<20 {
			t.Fatalf("host heap grew by %d MiB while streaming %d MiB", grow>>20, total>>20)
		}
	})
	t.Run("signal", func(t *testing.T) {
		p, err := b.ExecStream(ctx, "sleep", []string{"600"}, airlock.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		p.Signal(syscall.SIGTERM)
		res, err := p.Wait()
		if err != nil || res.ExitCode != 128+int(syscall.SIGTERM) || res.Signal != int(syscall.SIGTERM) {
			t.Fatalf("got %+v %v", res, err)
		}
	})
	t.Run("second process reaches the running box", func(t *testing.T) {
		exec(t, b, airlock.ExecOptions{}, "sh", "-c", "echo kept > /root/state")
		// Several reconnects in a row: each is a new agent connection over
		// the same virtio-serial port.
		for i := 0; i < 5; i++ {
			r2 := openRuntime(t, home)
			b2, err := r2.Get(ctx, "lifecycle")
			if err != nil {
				t.Fatal(err)
			}
			res := exec(t, b2, airlock.ExecOptions{}, "cat", "/root/state")
			if string(res.Stdout) != "kept\n" {
				t.Fatalf("reconnect %d: got %q", i, res.Stdout)
			}
			r2.Close()
		}
		// The first handle reconnects too.
		res := exec(t, b, airlock.ExecOptions{}, "cat", "/root/state")
		if string(res.Stdout) != "kept\n" {
			t.Fatalf("got %q", res.Stdout)
		}
	})
	t.Run("hostname and /etc files", func(t *testing.T) {
		res := exec(t, b, airlock.ExecOptions{}, "sh", "-c",
			`hostname; cat /etc/hostname 2>/dev/null || echo lifecycle; grep -c '127.0.1.1.*lifecycle' /etc/hosts; grep -c localhost /etc/hosts
			cat /etc/resolv.conf; echo '10.9.9.9 added' >> /etc/hosts && grep -c added /etc/hosts`)
		if want := "lifecycle\nlifecycle\n1\n2\nnameserver 10.0.2.3\n1\n"; string(res.Stdout) != want {
			t.Fatalf("got %q (stderr %q), want %q", res.Stdout, res.Stderr, want)
		}
	})
	t.Run("files survive stop and start", func(t *testing.T) {
		exec(t, b, airlock.ExecOptions{}, "sh", "-c", "echo persisted > /root/file; pip --version > /dev/null")
		t0 := time.Now()
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("stop took %s", time.Since(t0))
		if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); !errors.Is(err, airlock.ErrBoxNotRunning) {
			t.Fatalf("exec on stopped box: %v", err)
		}
		t0 = time.Now()
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("start took %s", time.Since(t0))
		res := exec(t, b, airlock.ExecOptions{}, "cat", "/root/file")
		if string(res.Stdout) != "persisted\n" {
			t.Fatalf("got %q %q", res.Stdout, res.Stderr)
		}
		// The stop unmounted the writable layer cleanly (no journal
		// recovery at the next mount), and /etc/hosts is made anew.
		res = exec(t, b, airlock.ExecOptions{}, "sh", "-c", "hostname; grep -c added /etc/hosts; dmesg | grep -c 'EXT4-fs.*recover'")
		if want := "lifecycle\n0\n0\n"; string(res.Stdout) != want {
			t.Fatalf("after restart: got %q (stderr %q), want %q", res.Stdout, res.Stderr, want)
		}
	})
	t.Run("remove kills qemu", func(t *testing.T) {
		info, err := b.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Remove(ctx, b.ID(), false); !errors.Is(err, airlock.ErrBoxRunning) {
			t.Fatalf("remove of running box without force: %v", err)
		}
		if err := r.Remove(ctx, b.ID(), true); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", info.PID)); err == nil && !strings.Contains(string(b), ") Z ") {
			t.Fatalf("qemu pid %d still alive after remove: %s", info.PID, b)
		}
		if _, err := r.Get(ctx, b.ID()); !errors.Is(err, airlock.ErrBoxNotFound) {
			t.Fatalf("get after remove: %v", err)
		}
	})
}

func TestBoxVMDeath(t *testing.T) {
	vmtest.Require(t)
	r := openRuntime(t, "")
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })
	res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", "ls /sys/class/net")
	if strings.Contains(string(res.Stdout), "eth0") {
		t.Errorf("network disabled but the box has eth0: %q", res.Stdout)
	}
	// A guest out of memory kills the guest process, not the box.
	res = exec(t, b, airlock.ExecOptions{}, "python3", "-c", "x = bytearray(2 << 30)")
	if res.ExitCode == 0 {
		t.Fatalf("allocating 2 GiB in a 512 MiB box succeeded")
	}
	if res = exec(t, b, airlock.ExecOptions{}, "echo", "alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("box unusable after guest OOM: %q", res.Stdout)
	}
	// A kernel panic while an exec is pending.
	p, err := b.ExecStream(ctx, "sleep", []string{"600"}, airlock.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go b.Exec(ctx, "sh", []string{"-c", "echo c > /proc/sysrq-trigger"}, airlock.ExecOptions{})
	done := make(chan struct{})
	var werr error
	go func() { _, werr = p.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("pending exec hung after the guest kernel panicked")
	}
	if !errors.Is(werr, airlock.ErrBoxDied) || !strings.Contains(werr.Error(), "panic") {
		t.Fatalf("pending exec error: %v", werr)
	}
	start := time.Now()
	_, err = b.Exec(ctx, "true", nil, airlock.ExecOptions{})
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("exec after death: %v after %s", err, time.Since(start))
	}
}

// TestHomeOnFullFilesystem: a home on another filesystem than the cache (a
// tmpfs) works, and when it is full, Create says so and leaves the box
// database and the name usable.
func TestHomeOnFullFilesystem(t *testing.T) {
	vmtest.Require(t)
	home := t.TempDir()
	if err := syscall.Mount("tmpfs", home, "tmpfs", 0, "size=1536k"); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(home, syscall.MNT_DETACH) })
	r := openRuntime(t, home)
	ctx := context.Background()
	_, err := r.Create(ctx, airlock.BoxOptions{Name: "roomy", Network: airlock.NetworkDisabled})
	if err == nil || !strings.Contains(err.Error(), "is full") {
		t.Fatalf("create on a full home: %v", err)
	}
	t.Logf("create on a full home: %v", err)
	if list, err := r.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("after the failed create: %+v %v", list, err)
	}
	if err := syscall.Mount("tmpfs", home, "tmpfs", syscall.MS_REMOUNT, "size=64m"); err != nil {
		t.Fatal(err)
	}
	b, err := r.Create(ctx, airlock.BoxOptions{Name: "roomy", Network: airlock.NetworkDisabled})
	if err != nil {
		t.Fatalf("create once there is room, same name: %v", err)
	}
	defer b.Remove(ctx, true)
	if res := exec(t, b, airlock.ExecOptions{}, "echo", "ok"); string(res.Stdout) != "ok\n" {
		t.Fatalf("got %q", res.Stdout)
	}
}
