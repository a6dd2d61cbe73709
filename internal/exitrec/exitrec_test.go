package exitrec

import (
	"errors"
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
		if k, kn := vmstatOOM(c.vmstat); k != c.killed || kn != c.known {
			t.Errorf("vmstatOOM(%q) = %v, %v", c.vmstat, k, kn)
		}
	}
	if !logOOM("[ 1.0] Out of memory: Killed process 42 (python)") || logOOM("all fine") {
		t.Error("LogOOM")
	}
	if !consoleOOM("x invoked oom-killer") || consoleOOM("booted") {
		t.Error("ConsoleOOM")
	}
}

func TestOOMKilledAsksInOrder(t *testing.T) {
	var asked []string
	run := func(out map[string]string) func(string, ...string) (string, error) {
		return func(cmd string, args ...string) (string, error) {
			asked = append(asked, cmd)
			if o, ok := out[cmd]; ok {
				return o, nil
			}
			return "", errors.New("not found")
		}
	}
	if !OOMKilled(run(map[string]string{"cat": "oom_kill 1\n"}), func() string { return "" }) || strings.Join(asked, " ") != "cat" {
		t.Errorf("counter: asked %v", asked)
	}
	asked = nil
	if OOMKilled(run(map[string]string{"cat": "oom_kill 0\n", "dmesg": "Out of memory: Killed process 1"}), func() string { return "oom-kill" }) {
		t.Error("a zero counter is the answer, whatever the logs say")
	}
	asked = nil
	if !OOMKilled(run(map[string]string{"cat": "nr_free_pages 1\n", "dmesg": "Out of memory: Killed process 1"}), func() string { return "" }) || strings.Join(asked, " ") != "cat dmesg" {
		t.Errorf("no counter: the kernel log; asked %v", asked)
	}
	if !OOMKilled(run(nil), func() string { return "x invoked oom-killer" }) {
		t.Error("nothing runs in the box: the console")
	}
}
