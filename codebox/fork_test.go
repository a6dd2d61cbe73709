package codebox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestForkContextsQEMU: a forkable context's variables are there in every
// fork child, under the same context id, and the children (and the parent)
// diverge independently; a forkable context behaves like a plain one
// (interrupt keeps state, a crash is reported as StateLost); a CodeBox with
// a plain context refuses to fork.
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
	x, err := cb.NewContext(ctx, codebox.ContextOptions{Forkable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("forkable context started in %s", time.Since(t0).Round(time.Millisecond))
	run(x, "x = 41\nimport os")
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

	// A plain context cannot be forked.
	if _, err := cb.NewContext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Fork(ctx, 1); err == nil || !strings.Contains(err.Error(), "Forkable") {
		t.Errorf("fork with a plain context: %v, want a Forkable error", err)
	}
}
