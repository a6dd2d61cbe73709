package airlock_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// The host's own exec timer, on the fake driver with its test-only wedge
// (the agent starts the process and forwards its output but never reports
// its end): a timed-out exec returns TimedOut on the host's authority with
// the output that arrived, the box is marked unhealthy, and a new boot
// clears the mark. (TestHostileWedgedAgentAndKilledVM does the same on QEMU.)
func TestWedgedAgentFake(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the host's ~9 s exec timer")
	}
	airlock.RequireTestFaults(t)
	drv := fake.New(os.Getenv("AIRLOCK_AGENT"))
	drv.TestWedgeExec = true
	h := fakeHarnessOn(t, drv)
	r := h.open(t, "")
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })
	if b.Unhealthy() != "" {
		t.Fatalf("new box unhealthy: %s", b.Unhealthy())
	}
	t0 := time.Now()
	res, err := b.Exec(ctx, "sh", []string{"-c", "echo before; sleep 600"}, airlock.ExecOptions{Timeout: time.Second, KillGrace: 100 * time.Millisecond})
	took := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.ExitCode != -1 || string(res.Stdout) != "before\n" || !strings.Contains(res.ErrorMessage, "unhealthy") {
		t.Fatalf("wedged exec: %+v", res)
	}
	if took > 20*time.Second {
		t.Fatalf("wedged exec returned after %s", took)
	}
	if !strings.Contains(b.Unhealthy(), "did not report the end") {
		t.Fatalf("Unhealthy = %q", b.Unhealthy())
	}
	t.Logf("wedged exec returned after %s: %s", took.Round(time.Millisecond), res.ErrorMessage)
	// The agent still answers (only its exec is wedged): the box is kept.
	time.Sleep(500 * time.Millisecond)
	if _, err := b.Info(ctx); err != nil {
		t.Fatalf("box after the wedge: %v", err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Unhealthy() != "" {
		t.Fatalf("unhealthy after a new boot: %s", b.Unhealthy())
	}
}
