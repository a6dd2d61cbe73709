package codebox_test

import (
	"context"
	"testing"
	"time"

	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestRollbackContextsQEMU: undo for an agent. x = 1 and a file at the
// checkpoint; x = 2, the file changed and a second context made after
// it; Rollback: x is 1 again in the same context, the file is as it was,
// and the second context (which had no interpreter at the checkpoint)
// runs on in a fresh one.
func TestRollbackContextsQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	cb := newCodeBox(t, codebox.Options{Timeout: 30 * time.Second})
	run := func(x *codebox.Context, code string) *codebox.Result {
		t.Helper()
		res, err := x.Run(ctx, code)
		if err != nil {
			t.Fatalf("run %q: %v", code, err)
		}
		return res
	}
	x, err := cb.NewContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run(x, "x = 1\nopen('/root/f', 'w').write('one')")
	if _, err := cb.Box().Checkpoint(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	run(x, "x = 2\nopen('/root/f', 'w').write('two')")
	y, err := cb.NewContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run(y, "y = 5")
	id := cb.Box().ID()

	if err := cb.Rollback(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if cb.Box().ID() != id {
		t.Fatalf("box id changed")
	}
	if got := run(x, "x").Value; got != "1" {
		t.Errorf("x after the rollback = %q, want 1", got)
	}
	if got := run(x, "open('/root/f').read()").Value; got != "'one'" {
		t.Errorf("the file after the rollback: %s", got)
	}
	if res := run(y, "y"); res.Error == nil || res.Error.Name != "NameError" {
		t.Errorf("the context made after the checkpoint: %+v, want a fresh interpreter (NameError)", res)
	}
	if got := run(y, "1 + 1").Value; got != "2" {
		t.Errorf("the fresh context: %q", got)
	}
}
