package scratch

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/airlock-run/airlock/internal/vmm"
)

// TestSweepRemovesOnlyTheDeads: entries of a process that exited and of a
// reused pid go; this process's, unmarked names and names with an unknown
// start time stay.
func TestSweepRemovesOnlyTheDeads(t *testing.T) {
	dir := t.TempDir()
	mine, err := MkdirTemp(dir, "snap-x")
	if err != nil {
		t.Fatal(err)
	}
	f, err := CreateTemp(dir, "commit", ".tar")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A process that has exited.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(dir, Prefix+strconv.Itoa(cmd.Process.Pid)+".12345.import-1")
	os.MkdirAll(filepath.Join(dead, "sub"), 0o700)
	// This pid with another start time: the pid was reused.
	reused := filepath.Join(dir, Prefix+strconv.Itoa(os.Getpid())+"."+strconv.FormatUint(vmm.StartTime(os.Getpid())+1, 10)+".x-1")
	os.WriteFile(reused, nil, 0o600)
	keep := []string{mine, f.Name(), filepath.Join(dir, ".tmp-old-123"), filepath.Join(dir, Prefix+"7.0.unknown-1"), filepath.Join(dir, Prefix+"junk")}
	for _, k := range keep[2:] {
		os.WriteFile(k, nil, 0o600)
	}
	gone := Sweep(dir)
	if len(gone) != 2 {
		t.Errorf("swept %v, want the dead process's and the reused pid's", gone)
	}
	for _, p := range []string{dead, reused} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", p, err)
		}
	}
	for _, p := range keep {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed: %v", p, err)
		}
	}
}
