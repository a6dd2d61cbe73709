package airlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestHostCapacity: a box whose memory passes the host cap is refused at
// creation, and a box that would pass the running-box cap at start; both
// errors name the cap and its variable.
func TestHostCapacity(t *testing.T) {
	vmtest.Require(t)
	r := openRuntime(t, "")
	ctx := context.Background()
	t.Setenv("AIRLOCK_MAX_MEMORY", "1024")
	_, err := r.Create(ctx, airlock.BoxOptions{MemoryMiB: 2048})
	var ce *airlock.CapacityError
	if !errors.As(err, &ce) || ce.Cap != "AIRLOCK_MAX_MEMORY" || !strings.Contains(err.Error(), "AIRLOCK_MAX_MEMORY=") {
		t.Fatalf("--memory above the cap: %v", err)
	}
	if boxes, _ := r.List(ctx); len(boxes) != 0 {
		t.Fatalf("refused box left a record: %+v", boxes)
	}
	t.Setenv("AIRLOCK_MAX_MEMORY", "")
	t.Setenv("AIRLOCK_MAX_BOXES", "1")
	// Other boxes may be running on this host (other tests): the cap of 1
	// is then already reached; if none runs, the first box fits and a
	// second one does not.
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled})
	if err == nil {
		defer b.Remove(ctx, true)
		_, err = r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled})
	}
	if !errors.As(err, &ce) || ce.Cap != "AIRLOCK_MAX_BOXES" || !strings.Contains(err.Error(), "AIRLOCK_MAX_BOXES=N") {
		t.Fatalf("box over the running-box cap: %v", err)
	}
}
