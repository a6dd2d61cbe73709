package fake_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/fake"
	"github.com/airlock-run/airlock/internal/vmm/vmmtest"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// agent is the guest agent binary the fake machines run.
var agent string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "airlock-fake-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agent, err = vmtest.BuildAgent(dir)
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func harness(d vmm.Driver) vmmtest.Harness {
	return vmmtest.Harness{
		Driver: d,
		Spec: func(t *testing.T, id, dir string) vmm.Spec {
			return vmm.Spec{ID: id, Dir: dir, CPUs: 1, MemoryMiB: 64, Hostname: id}
		},
		Files: func(spec vmm.Spec) string { return fake.FilesDir(spec.Dir) },
	}
}

// TestDriverSuite: the fake driver without snapshots or pause passes the
// driver conformance suite (those cases skipped).
func TestDriverSuite(t *testing.T) {
	d := fake.New(agent)
	d.Scope = t.Name() // Usage counts this test's machines only
	vmmtest.Suite(t, harness(d))
}

// TestDriverSuiteSnapshotting: the fake driver with snapshots and pause
// passes all of it.
func TestDriverSuiteSnapshotting(t *testing.T) {
	d := fake.NewSnapshotting(agent)
	d.Scope = t.Name() // Usage counts this test's machines only
	vmmtest.Suite(t, harness(d))
}
