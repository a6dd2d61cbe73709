package codebox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestForkContextsQEMU: a context's variables are there in every fork
// child, under the same context id, and the children (and the parent)
// diverge independently, each with its random module reseeded; interrupt
// keeps state and a crash is reported as StateLost in a child; Close kills
// the context's interpreter daemon (and what it started).
func TestForkContextsQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	cb := newCodeBox(t, codebox.Options{Timeout: 20 * time.Second, InterruptGrace: 5 * time.Second})
	run := func(x *codebox.Context, code string) *codebox.Result {
		t.Helper()
		res, err := x.Run(ctx, code)
		if err != nil {
			t.Fatalf("run %q: %v", code, err)
		}
		if res.Error != nil {
			t.Fatalf("run %q: %v", code, res.Error)
		}
		return res
	}
	t0 := time.Now()
	x, err := cb.NewContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("context started in %s", time.Since(t0).Round(time.Millisecond))
	run(x, "x = 41\nimport os, random")
	if got := run(x, "x + 1").Value; got != "42" {
		t.Fatalf("x + 1 = %q", got)
	}

	t0 = time.Now()
	kids, err := cb.Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork into 2 CodeBoxes with their contexts: %s", time.Since(t0).Round(time.Millisecond))
	for _, k := range kids {
		t.Cleanup(func() { k.Close() })
	}
	for i, k := range kids {
		// Like New's box, a child goes with this program.
		if info, err := k.Box().Info(ctx); err != nil || !info.Options.AutoRemove {
			t.Errorf("child %d: AutoRemove %v (%v), want true", i, info.Options.AutoRemove, err)
		}
		kx := k.Context(x.ID())
		if kx == nil {
			t.Fatalf("child %d has no context %s", i, x.ID())
		}
		if got := run(kx, "x + 1").Value; got != "42" {
			t.Fatalf("child %d: x + 1 = %q, want 42 (the parent's variable)", i, got)
		}
		run(kx, "x = "+[]string{"100", "200"}[i])
	}
	// Like os.fork's children, each child's random module is reseeded.
	r0, r1 := run(kids[0].Context(x.ID()), "random.random()").Value, run(kids[1].Context(x.ID()), "random.random()").Value
	if r0 == r1 {
		t.Errorf("two fork children drew the same random number %s", r0)
	}
	run(x, "x = 7")
	for i, k := range kids {
		want := []string{"101", "201"}[i]
		if got := run(k.Context(x.ID()), "x + 1").Value; got != want {
			t.Errorf("child %d: x + 1 = %q, want %s (diverged on its own)", i, got, want)
		}
	}
	if got := run(x, "x + 1").Value; got != "8" {
		t.Errorf("parent: x + 1 = %q, want 8", got)
	}
	// The children's interpreters are their own processes in their own
	// guests: a child's pid is the parent's (same guest memory), yet
	// killing one child's interpreter leaves the others alone.
	res, err := kids[0].Context(x.ID()).Run(ctx, "os._exit(3)")
	if err != nil || !res.StateLost || res.Error == nil || res.Error.Name != "KernelDied" {
		t.Fatalf("crash in child 0: %+v %v", res, err)
	}
	if got := run(kids[1].Context(x.ID()), "x").Value; got != "200" {
		t.Errorf("child 1 after child 0's crash: x = %q", got)
	}
	if got := run(x, "x").Value; got != "7" {
		t.Errorf("parent after child 0's crash: x = %q", got)
	}

	// SIGINT goes through the relay to the interpreter: the cell stops,
	// the state stays.
	kx := kids[1].Context(x.ID())
	ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
	ir, err := kx.Run(ictx, "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    y = 'interrupted'\n    raise")
	cancel()
	if err == nil || ir == nil || !ir.TimedOut || ir.StateLost {
		t.Fatalf("interrupted cell in a child: %+v %v", ir, err)
	}
	if got := run(kx, "y, x").Value; got != "('interrupted', 200)" {
		t.Errorf("after the interrupt: %q", got)
	}

	// Close kills the interpreter daemon and what it started, and removes
	// its directory.
	pid := run(x, "import subprocess; p = subprocess.Popen(['sleep', '600']); os.getpid()").Value
	sub := run(x, "p.pid").Value
	x.Close()
	left, err := cb.Exec(ctx, "sh", []string{"-c", `kill -0 $1 2>/dev/null && echo kernel; kill -0 $2 2>/dev/null && echo sleep; ls /tmp/.airlock-codebox/run`, "sh", pid, sub}, airlock.ExecOptions{})
	if err != nil || strings.TrimSpace(string(left.Stdout)) != "" {
		t.Errorf("after Close, left in the box: %q %v", left.Stdout, err)
	}
}
