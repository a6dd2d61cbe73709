package exitrec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
)

func TestRecordFirstReasonOfABootWins(t *testing.T) {
	dir := t.TempDir()
	boot := time.Unix(1700000000, 5)
	Record(dir, boot, State{Reason: "exited", ExitCode: 5})
	Record(dir, boot, State{Reason: "stopped"})
	s, ok := Read(dir, boot)
	if !ok || s.Reason != "exited" || s.ExitCode != 5 || s.Finished.IsZero() || !s.Boot.Equal(boot) {
		t.Fatalf("got %+v %v, want the first reason", s, ok)
	}
	if _, ok := Read(dir, boot.Add(time.Second)); ok {
		t.Error("the record of one boot describes another")
	}
	Record(dir, time.Time{}, State{Reason: "stopped"})
	if s, _ := Read(dir, boot); s.Reason != "exited" {
		t.Errorf("a zero boot overwrote the record: %+v", s)
	}
	if _, err := os.Stat(filepath.Join(dir, boxdir.Exit+".tmp")); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
	// A file that is not a record (too large, not JSON) is none.
	os.WriteFile(filepath.Join(dir, boxdir.Exit), []byte(strings.Repeat(" ", maxFile+1)), 0o600)
	if _, ok := Read(dir, boot); ok {
		t.Error("an oversized file read as a record")
	}
}

func TestOOMWords(t *testing.T) {
	for _, c := range []struct {
		vmstat        string
		killed, known bool
	}{
		{"nr_free_pages 5\noom_kill 2\n", true, true},
		{"oom_kill 0\n", false, true},
		{"nr_free_pages 5\n", false, false},
	} {
		if k, kn := VMStatOOM(c.vmstat); k != c.killed || kn != c.known {
			t.Errorf("VMStatOOM(%q) = %v, %v", c.vmstat, k, kn)
		}
	}
	if !LogOOM("[ 1.0] Out of memory: Killed process 42 (python)") || LogOOM("all fine") {
		t.Error("LogOOM")
	}
	if !ConsoleOOM("x invoked oom-killer") || ConsoleOOM("booted") {
		t.Error("ConsoleOOM")
	}
}
