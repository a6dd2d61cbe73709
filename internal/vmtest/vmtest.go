// Package vmtest holds helpers for tests that boot real boxes (QEMU, under
// TCG on machines without usable KVM). Such tests skip with the reason when
// a prerequisite is missing, unless AIRLOCK_REQUIRE_VM=1 (set by CI), which
// turns a missing prerequisite into a failure.
package vmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/image"
)

// DefaultImage is the image VM tests use; hack/setup.sh builds it.
const DefaultImage = "python:slim"

// NetClientsImage has the HTTP clients users run in boxes (curl, Python's
// requests and httpx, Node.js): the secrets tests send through each.
// hack/setup.sh builds it.
const NetClientsImage = "airlock/net-clients:1"

// BuildAgent compiles cmd/airlock-agent (static) into dir and returns its
// path. Call it from TestMain. A test binary built with -tags
// airlock_testfaults gets an agent built with it too.
func BuildAgent(dir string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	out := filepath.Join(dir, "airlock-agent")
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", out}
	if guestabi.TestFaults {
		// This test binary was built with the test-only faults: so is the
		// agent, whose half of them (the exec wedge) the tests turn on.
		args = append(args, "-tags", "airlock_testfaults")
	}
	cmd := exec.Command("go", append(args, "./cmd/airlock-agent")...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build agent: %v\n%s", err, b)
	}
	return out, nil
}

// BuildNetHelper compiles cmd/airlock-net, the network helper boxes with a
// network run, into dir and returns its path.
func BuildNetHelper(dir string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	out := filepath.Join(dir, "airlock-net")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./cmd/airlock-net")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build network helper: %v\n%s", err, b)
	}
	return out, nil
}

// Main is a TestMain for packages with VM tests: it isolates the test
// binary from the user's home and image store (Isolate), builds the guest
// agent and the network helper into a temporary directory, points
// AIRLOCK_AGENT and AIRLOCK_NET_HELPER at them, runs the tests and cleans
// up. It returns the exit code for os.Exit.
func Main(m *testing.M) int {
	if len(os.Args) > 1 && os.Args[1] == "__main" {
		// A test ran the CLI in-process and it started a box's detached
		// main command by executing itself (os.Executable: this test
		// binary): that would run every test again. Tests of detached
		// commands use the built airlock binary (internal/cli).
		fmt.Fprintln(os.Stderr, "vmtest: a test binary cannot be a detached main command (run -d through the in-process CLI); use the built airlock binary")
		return 2
	}
	done, err := Isolate()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := mainIsolated(m)
	if err := done(); err != nil {
		fmt.Fprintln(os.Stderr, "vmtest:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func mainIsolated(m *testing.M) int {
	dir, err := os.MkdirTemp("", "airlock-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agent, err := BuildAgent(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv("AIRLOCK_AGENT", agent)
	helper, err := BuildNetHelper(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv("AIRLOCK_NET_HELPER", helper)
	return m.Run()
}

// Missing returns why boxes cannot boot here ("" when they can): QEMU, a
// guest kernel, or the default image is missing.
func Missing() string {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "qemu-system-x86_64 not installed (run hack/setup.sh)"
	}
	if _, _, err := assets.FindKernel(""); err != nil {
		return err.Error()
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		return "mkfs.erofs not installed (run hack/setup.sh)"
	}
	dir := ImagesDir()
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return fmt.Sprintf("no image store at %s (run hack/setup.sh)", dir)
	}
	s, err := image.Open(dir)
	if err != nil {
		return err.Error()
	}
	if _, err := s.Resolve(DefaultImage); err != nil {
		return fmt.Sprintf("image %s not in %s (run hack/setup.sh)", DefaultImage, dir)
	}
	return ""
}

// Require skips (or, with AIRLOCK_REQUIRE_VM=1, fails) t when boxes cannot
// boot here, and when -short is set.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM; skipped with -short")
	}
	if why := Missing(); why != "" {
		if os.Getenv("AIRLOCK_REQUIRE_VM") == "1" {
			t.Fatalf("cannot boot boxes: %s", why)
		}
		t.Skipf("cannot boot boxes: %s", why)
	}
}

// RequireImage is Require, and skips (or, with AIRLOCK_REQUIRE_VM=1,
// fails) t when image ref is not in the test image store.
func RequireImage(t testing.TB, ref string) {
	t.Helper()
	Require(t)
	s, err := image.Open(ImagesDir())
	if err == nil {
		_, err = s.Resolve(ref)
	}
	if err != nil {
		if os.Getenv("AIRLOCK_REQUIRE_VM") == "1" {
			t.Fatalf("image %s not in %s (run hack/setup.sh): %v", ref, ImagesDir(), err)
		}
		t.Skipf("image %s not in %s (run hack/setup.sh): %v", ref, ImagesDir(), err)
	}
}
