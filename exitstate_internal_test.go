package airlock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestRecordExitFirstReasonOfABootWins(t *testing.T) {
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, "boxes", "b1"), 0o700)
	boot := time.Unix(1700000000, 5)
	recordExit(home, "b1", boot, ExitState{Reason: ExitExited, ExitCode: 5})
	recordExit(home, "b1", boot, ExitState{Reason: ExitStopped}) // the Stop after the main command
	e, ok := readExit(home, "b1", boot)
	if !ok || e.Reason != ExitExited || e.ExitCode != 5 || e.Finished.IsZero() || e.String() != "exited (5)" {
		t.Fatalf("got %+v %v", e, ok)
	}
	// A later boot is not described by the earlier boot's record.
	next := boot.Add(time.Minute)
	if _, ok := readExit(home, "b1", next); ok {
		t.Fatal("a record of the previous boot describes the next")
	}
	recordExit(home, "b1", next, ExitState{Reason: ExitVMDied, Cause: "guest kernel panic"})
	if e, ok := readExit(home, "b1", next); !ok || e.String() != "VM died: guest kernel panic" {
		t.Fatalf("next boot: %+v %v", e, ok)
	}
	// A box that never booted records nothing.
	recordExit(home, "b1", time.Time{}, ExitState{Reason: ExitStopped})
	if e, _ := readExit(home, "b1", next); e.Reason != ExitVMDied {
		t.Fatalf("zero boot overwrote the record: %+v", e)
	}
}

func TestExecEmptyCommandIsInvalidArgument(t *testing.T) {
	b := &Box{id: "0123456789ab"}
	for _, cmd := range []string{"", "  "} {
		_, err := b.Exec(context.Background(), cmd, nil, ExecOptions{})
		if !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("Exec(%q): %v, want ErrInvalidArgument", cmd, err)
		}
	}
}
