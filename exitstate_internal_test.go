package airlock

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

func TestRecordExitFirstReasonOfABootWins(t *testing.T) {
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, "boxes", "b1"), 0o700)
	boot := time.Unix(1700000000, 5)
	recordExit(home, "b1", boot, ExitState{Reason: ExitExited, ExitCode: 5})
	recordExit(home, "b1", boot, ExitState{Reason: ExitStopped}) // the Stop after the main command
	r := &Runtime{opts: Options{Home: home}}
	readExit := func(home, id string, boot time.Time) (ExitState, bool) {
		if e := r.exitOf(BoxInfo{ID: id, State: BoxStopped, Started: boot}); e != nil {
			return *e, true
		}
		return ExitState{}, false
	}
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

// TestOpenRecordsWhyAnUnwatchedBoxStopped: a box recorded running whose
// machine ended while no process watched it (the process that started it
// is gone) is marked stopped when a runtime next opens its home, with the
// cause its console gives as the exit state.
func TestOpenRecordsWhyAnUnwatchedBoxStopped(t *testing.T) {
	home := t.TempDir()
	opts, err := Options{Home: home, ImagesDir: t.TempDir(), CacheDir: t.TempDir(), Warn: func(string) {}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r, err := openWith(opts, fake.New("/nonexistent/agent"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rec := &store.Box{ID: "0123456789ab", Image: "x", Config: encodeConfig(boxConfig{Options: BoxOptions{Network: NetworkEnabled}}),
		State: store.StateCreated, Created: time.Now()}
	if err := r.db.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(home, "boxes", rec.ID)
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, boxdir.Console), []byte("booting\nKernel panic - not syncing: Attempted to kill init!\n"), 0o600)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	boot := time.Now().Add(-time.Minute)
	if err := r.db.SetRunning(ctx, rec.ID, dead.Process.Pid, 1, boot); err != nil {
		t.Fatal(err)
	}
	r.Close()

	r, err = openWith(opts, fake.New("/nonexistent/agent"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	list, err := r.List(ctx)
	if err != nil || len(list) != 1 || list[0].State != store.StateStopped {
		t.Fatalf("after reopening: %+v %v", list, err)
	}
	e, ok := r.ExitState(list[0])
	if !ok || e.Reason != ExitVMDied || !strings.Contains(e.Cause, "guest kernel panic") || !e.Boot.Equal(boot) {
		t.Fatalf("exit state: %+v %v", e, ok)
	}
}
