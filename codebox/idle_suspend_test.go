package codebox_test

import (
	"context"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestContextSurvivesIdleSuspendQEMU: scale to zero keeps an agent's
// state. A context sets x; the box's idle timeout suspends it (its relay
// ends with the machine); the next Run resumes the box, reattaches to
// the same interpreter and finds x, with no state lost.
func TestContextSurvivesIdleSuspendQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	cb := newCodeBox(t, codebox.Options{Timeout: time.Minute,
		BoxOptions: airlock.BoxOptions{IdleTimeout: 3 * time.Second, IdleAction: airlock.IdleSuspend}})
	x, err := cb.NewContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := x.Run(ctx, "x = 41"); err != nil || res.Error != nil {
		t.Fatalf("x = 41: %+v %v", res, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		info, err := cb.Box().Info(ctx)
		if err == nil && info.Suspended && info.State == airlock.BoxStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not suspended by its idle timeout within 2 min: %+v %v", info, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	res, err := x.Run(ctx, "x + 1")
	if err != nil {
		t.Fatal(err)
	}
	if res.StateLost || res.Value != "42" {
		t.Errorf("x + 1 after the idle suspend: value %q, state lost %v, error %+v", res.Value, res.StateLost, res.Error)
	}
}
