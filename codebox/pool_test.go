package codebox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/friend"
	"github.com/airlock-run/airlock/internal/vmtest"
)

func runCell(t *testing.T, x *codebox.Context, code string) *codebox.Result {
	t.Helper()
	res, err := x.Run(context.Background(), code)
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	return res
}

func value(t *testing.T, x *codebox.Context, code string) string {
	t.Helper()
	res := runCell(t, x, code)
	if res.Error != nil {
		t.Fatalf("run %q: %v\n%s", code, res.Error, res.Error.Traceback)
	}
	return res.Value
}

// TestPoolQEMU: CodeBoxes from a codebox pool: the first context adopts
// the interpreter the pool box started (same pid as the parked one) and
// runs code at once; two pool boxes draw different random numbers and
// hash a str differently (each its own interpreter, not the template's);
// the user's namespace is empty; a timed-out cell is
// interrupted with the kernel kept; a kernel that exits is replaced by a
// fresh one; a second context starts as usual; Attach on a pool box made
// by Create adopts it too; Close leaves no QEMU running.
func TestPoolQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	home := t.TempDir()
	rt, err := airlock.Open(airlock.Options{Home: home, ImagesDir: vmtest.ImagesDir(), AgentPath: agentPath,
		Warn: func(m string) { t.Log("warn: ", m) }, Pool: []airlock.PoolOptions{codebox.Pool(codebox.Options{}, 2),
			// An image without the pool's interpreter: a pool of plain boxes.
			codebox.Pool(codebox.Options{BoxOptions: airlock.BoxOptions{MemoryMiB: 256}, Python: "no-such-python"}, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := rt.WaitPools(wctx); err != nil {
		t.Fatalf("%v: %+v", err, rt.Pools())
	}
	t.Logf("pools: %+v", rt.Pools())
	plain, err := rt.Create(ctx, airlock.BoxOptions{MemoryMiB: 256, AutoRemove: true})
	if err != nil {
		t.Fatal(err)
	}
	if !plain.FromPool() || friend.TakeWarm(plain) != nil {
		t.Fatalf("box of the pool without Python: from pool %v, want a plain pool box", plain.FromPool())
	}
	plain.Remove(ctx, true)

	t0 := time.Now()
	cb, err := codebox.New(ctx, rt, codebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	x, err := cb.NewContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := value(t, x, "x = 1\nx + 1"); v != "2" {
		t.Fatalf("x + 1 = %q", v)
	}
	t.Logf("New -> first Run result: %s", time.Since(t0))
	if !cb.Box().FromPool() {
		t.Fatal("the CodeBox did not come from the pool")
	}
	parked, err := cb.Exec(ctx, "cat", []string{"/tmp/.airlock-codebox/run/warm/pid"}, airlock.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pid := value(t, x, "import os; os.getpid()"); pid != strings.TrimSpace(string(parked.Stdout)) {
		t.Errorf("context pid %s, parked kernel pid %q: the context did not adopt the parked kernel", pid, parked.Stdout)
	}
	if v := value(t, x, "sorted(k for k in globals() if not k.startswith('__'))"); v != "['_', 'os', 'x']" {
		t.Errorf("user namespace %s, want only this cell's names (the reseed leaves none)", v)
	}
	if res := runCell(t, x, "1/0"); res.Error == nil || !strings.Contains(res.Error.Traceback, "<cell-4>") {
		t.Errorf("the fourth cell is not <cell-4> (the reseed counted as a cell?): %+v", res.Error)
	}

	// Attach on a box Create took from the pool (airlock serve's path).
	b, err := rt.Create(ctx, airlock.BoxOptions{Image: airlock.DefaultImage, AutoRemove: true})
	if err != nil {
		t.Fatal(err)
	}
	if !b.FromPool() {
		t.Fatal("Create with the pool's options did not take a pool box")
	}
	ab := codebox.Attach(b, codebox.Options{})
	y, err := ab.NewContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := value(t, x, "import random; random.random()"), value(t, y, "import random; random.random()")
	if r1 == r2 {
		t.Errorf("two pool boxes' kernels drew the same random number %s", r1)
	}
	// Each pool box's interpreter has its own str hash seed
	// (PYTHONHASHSEED is drawn at interpreter start).
	h1, h2 := value(t, x, "hash('airlock')"), value(t, y, "hash('airlock')")
	if h1 == h2 {
		t.Errorf("two pool boxes' kernels hash a str alike (%s): one shared hash seed", h1)
	}
	p2, _ := b.Exec(ctx, "cat", []string{"/tmp/.airlock-codebox/run/warm/pid"}, airlock.ExecOptions{})
	if pid := value(t, y, "import os; os.getpid()"); pid != strings.TrimSpace(string(p2.Stdout)) {
		t.Errorf("attached context pid %s, parked %q", pid, p2.Stdout)
	}
	ab.Close()
	b.Remove(ctx, true)

	// Interrupt: the cell stops, the kernel and its state stay.
	ictx, icancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	res, err := x.Run(ictx, "import time; time.sleep(60)")
	icancel()
	if !errors.Is(err, context.DeadlineExceeded) || res == nil || !res.TimedOut || res.StateLost {
		t.Fatalf("interrupted cell: %+v, %v; want TimedOut with state kept", res, err)
	}
	if v := value(t, x, "x"); v != "1" {
		t.Fatalf("x after the interrupt = %q", v)
	}
	// A kernel that exits is replaced.
	res = runCell(t, x, "import os; os._exit(3)")
	if !res.StateLost || res.Error == nil || res.Error.Name != "KernelDied" {
		t.Fatalf("exit: %+v", res)
	}
	if v := value(t, x, "2 + 2"); v != "4" {
		t.Fatalf("after the restart: %q", v)
	}
	// A second context starts an interpreter of its own.
	z, err := cb.NewContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := value(t, z, "'x' in globals()"); v != "False" {
		t.Errorf("second context sees x: %s", v)
	}
	t0 = time.Now()
	if err := cb.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close: %s", time.Since(t0))
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	for pid, cmd := range vmtest.HomeProcesses(home) {
		t.Errorf("process %d left after Close: %s", pid, cmd)
	}
}
