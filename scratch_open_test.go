package airlock_test

import (
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/scratch"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// TestOpenSweepsDeadScratch: Open removes what a killed process left in
// the home's scratch places (a half-written snapshot, an import's disk)
// and keeps a running process's.
func TestOpenSweepsDeadScratch(t *testing.T) {
	home := t.TempDir()
	cmd := osexec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	deadOwner := strconv.Itoa(cmd.Process.Pid) + ".12345."
	var dead, live []string
	for _, d := range []string{filepath.Join(home, "tmp"), filepath.Join(home, "snapshots")} {
		os.MkdirAll(d, 0o700)
		p := filepath.Join(d, scratch.Prefix+deadOwner+"snapshot-s-1")
		os.MkdirAll(filepath.Join(p, "inner"), 0o700)
		os.WriteFile(filepath.Join(p, "inner", "ram"), []byte("big"), 0o600)
		dead = append(dead, p)
		mine, err := scratch.MkdirTemp(d, "import")
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, mine)
	}
	r, err := airlock.OpenWithDriver(airlock.Options{Home: home, ImagesDir: t.TempDir(), CacheDir: t.TempDir(), Warn: func(string) {}},
		fake.New(os.Getenv("AIRLOCK_AGENT")))
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	for _, p := range dead {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("a dead process's %s is left: %v", p, err)
		}
	}
	for _, p := range live {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("this process's %s was removed: %v", p, err)
		}
	}
}
