package lifecycle

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
)

// TestForkRemovesTheMadeOnFailure: when one child fails, the children
// made are removed (with the reason given) and none is returned; when
// all are made, all are returned.
func TestForkRemovesTheMadeOnFailure(t *testing.T) {
	var mu sync.Mutex
	var removed []int
	mk := Maker[int]{Remove: func(_ context.Context, b int, why string) {
		if why != "fork_failed" {
			t.Errorf("removed %d for %q", b, why)
		}
		mu.Lock()
		removed = append(removed, b)
		mu.Unlock()
	}}
	var n atomic.Int32
	boom := errors.New("boom")
	kids, err := mk.Fork(context.Background(), 4, "fork_failed", func(context.Context) (int, error) {
		i := int(n.Add(1))
		if i == 3 {
			return 0, boom
		}
		return i, nil
	})
	if !errors.Is(err, boom) || kids != nil {
		t.Fatalf("Fork = %v, %v; want nil, boom", kids, err)
	}
	sort.Ints(removed)
	if len(removed) != 3 || removed[0] != 1 || removed[1] != 2 || removed[2] != 4 {
		t.Errorf("removed %v, want the three made: [1 2 4]", removed)
	}
	n.Store(0)
	removed = nil
	kids, err = mk.Fork(context.Background(), 3, "fork_failed", func(context.Context) (int, error) { return int(n.Add(1)), nil })
	if err != nil || len(kids) != 3 || len(removed) != 0 {
		t.Errorf("Fork = %v, %v (removed %v); want three children", kids, err, removed)
	}
}
