package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmtest"
)

var airlockBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "airlock-cli-test-")
	if err != nil {
		panic(err)
	}
	airlockBin = filepath.Join(dir, "airlock")
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", airlockBin, "./cmd/airlock")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	if b, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build airlock: %v\n%s", err, b)
		os.Exit(1)
	}
	code := vmtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

type cli struct {
	t    *testing.T
	home string
}

// run runs the airlock binary as a new process, like a user would.
func (c cli) run(args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	cmd := exec.Command(airlockBin, args...)
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+c.home, "AIRLOCK_IMAGES="+vmtest.ImagesDir())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// qemuOf lists QEMU processes whose command line mentions the home.
var (
	seenBoxesMu sync.Mutex
	seenBoxes   = map[string][]string{}
)

func qemuOf(home string) []string {
	out, _ := exec.Command("pgrep", "-f", "qemu-system-x86_64 -name airlock-").Output()
	// A confined QEMU's command line names no host path: match the -name
	// of the home's boxes, including those seen by earlier calls (a
	// removed box's QEMU may have survived).
	ents, _ := os.ReadDir(filepath.Join(home, "boxes"))
	seenBoxesMu.Lock()
	for _, e := range ents {
		seenBoxes[home] = append(seenBoxes[home], e.Name())
	}
	ids := append([]string(nil), seenBoxes[home]...)
	seenBoxesMu.Unlock()
	var pids []string
	for _, p := range strings.Fields(string(out)) {
		b, _ := os.ReadFile("/proc/" + p + "/cmdline")
		st, _ := os.ReadFile("/proc/" + p + "/stat")
		mine := strings.Contains(string(b), home)
		for _, id := range ids {
			mine = mine || strings.Contains(string(b), "\x00-name\x00airlock-"+id+"\x00")
		}
		if mine && !strings.Contains(string(st), ") Z ") {
			pids = append(pids, p)
		}
	}
	return pids
}

func TestCLIRun(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	out, errs, code := c.run("run", "--rm", "python:slim", "python3", "-c", "print(sum(range(10)))")
	if code != 0 || out != "45\n" {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errs)
	}
	if !strings.Contains(errs, "TCG") && !strings.Contains(errs, "") {
		t.Fatalf("stderr %q", errs)
	}
	out, errs, code = c.run("run", "--rm", "--network", "disabled", "python:slim", "sh", "-c", "echo a; echo b >&2; exit 3")
	if code != 3 || out != "a\n" || !strings.HasSuffix(errs, "b\n") {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errs)
	}
	start := time.Now()
	out, errs, code = c.run("run", "--rm", "--timeout", "3s", "python:slim", "sh", "-c", "sleep 600 & sleep 600")
	if code != 124 || !strings.Contains(errs, "timed out") {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errs)
	}
	if d := time.Since(start); d > 60*time.Second {
		t.Fatalf("took %s", d)
	}
	// A fork bomb under --timeout ends with 124, within seconds of it.
	start = time.Now()
	_, errs, code = c.run("run", "--rm", "--network", "disabled", "--timeout", "20s", "python:slim", "sh", "-c", "f() { f | f & }; f; sleep 100")
	if code != 124 || !strings.Contains(errs, "timed out after 20s") {
		t.Fatalf("fork bomb: code %d stderr tail %q", code, errs[max(0, len(errs)-300):])
	}
	t.Logf("fork bomb under --timeout 20s: exit 124 after %s", time.Since(start).Round(time.Millisecond))
	// A guest OOM kill is said so, on a line of airlock's own after the
	// command's stderr.
	out, errs, code = c.run("run", "--rm", "--network", "disabled", "python:slim", "python3", "-c", "print('before', flush=True); a = [b'x' * (32 << 20) for _ in range(64)]")
	if code != 137 || out != "before\n" || !strings.Contains(errs, "airlock: out of memory: the box's OOM killer killed a process of the command; give the box more with --memory (it has 512 MiB)\n") {
		t.Fatalf("OOM: code %d stdout %q stderr %q", code, out, errs)
	}
	if q := qemuOf(c.home); len(q) != 0 {
		t.Fatalf("QEMU left behind: %v", q)
	}
	if out, _, _ := c.run("ls", "-aq"); strings.TrimSpace(out) != "" {
		t.Fatalf("boxes left behind with --rm: %q", out)
	}
	_, errs, code = c.run("run", "--rm", "no-such-image:1")
	if code != 125 || !strings.Contains(errs, "not found") {
		t.Fatalf("code %d stderr %q", code, errs)
	}
	// -e KEY passes this process's value of KEY, or nothing when unset
	// (Docker CLI semantics).
	t.Setenv("AIRLOCK_TEST_FROM_HOST", "host value")
	os.Unsetenv("AIRLOCK_TEST_UNSET")
	out, errs, code = c.run("run", "--rm", "-e", "AIRLOCK_TEST_FROM_HOST", "-e", "AIRLOCK_TEST_UNSET", "-e", "A=1=2",
		"python:slim", "sh", "-c", `echo "$AIRLOCK_TEST_FROM_HOST|${AIRLOCK_TEST_UNSET-unset}|$A"`)
	if code != 0 || out != "host value|unset|1=2\n" {
		t.Fatalf("-e: code %d stdout %q stderr %q", code, out, errs)
	}
}

// TestCLIFlagErrors: bad flag values fail with status 125 before anything
// boots, with a hint about the flag at fault.
// TestCLIMCPFlagsMatchRun: airlock mcp takes run's network flags and size
// syntax, with run's help (it once documented the old mode names).
func TestCLIMCPFlagsMatchRun(t *testing.T) {
	c := cli{t, t.TempDir()}
	out, _, code := c.run("mcp", "--help")
	if code != 0 {
		t.Fatalf("mcp --help: exit %d", code)
	}
	for _, want := range []string{`"public" (default`, `"allowlist"`, `"none"`, "--allow-net", "--allow-host-port", "512m, 2g", "--secret"} {
		if !strings.Contains(out, want) {
			t.Errorf("mcp --help lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "enabled") || strings.Contains(out, "disabled") {
		t.Errorf("mcp --help names the old network modes:\n%s", out)
	}
}

func TestCLIFlagErrors(t *testing.T) {
	c := cli{t, t.TempDir()}
	for _, tc := range []struct {
		args         []string
		want, reject string
	}{
		{[]string{"run", "--cpus", "0", "python:slim", "true"}, "--cpus 0: want 1..64", ""},
		{[]string{"run", "--cpus", "abc", "python:slim", "true"}, "--cpus takes a number of vCPUs", "MiB"},
		{[]string{"run", "-e", "=x", "python:slim", "true"}, "want KEY=VALUE", ""},
		{[]string{"exec", "-e", "", "somebox", "true"}, "want KEY=VALUE", ""},
		{[]string{"run", "--timeout", "3", "python:slim", "true"}, "--timeout takes a duration", "MiB"},
		{[]string{"run", "--memory", "1q", "python:slim", "true"}, "want a size such as 512m or 2g", "duration"},
		{[]string{"run", "--memory", "100000g", "python:slim", "true"}, "more than this host's RAM", ""},
		{[]string{"run", "--disk-size", "abc", "python:slim", "true"}, "--disk-size \"abc\"", ""},
		{[]string{"mcp", "--memory", "1q"}, "want a size such as 512m or 2g", ""},
		{[]string{"mcp", "--secret", "AIRLOCK_TEST_UNSET_SECRET=api.example.com"}, "$AIRLOCK_TEST_UNSET_SECRET is not set in this shell", ""},
		{[]string{"run", "--bogus", "python:slim"}, "unknown flag: --bogus", "MiB"},
		{[]string{"fork", "somebox", "-n", "0"}, "fork: -n 0: want 1..64", ""},
		{[]string{"fork", "somebox", "-n", "65"}, "fork: -n 65: want 1..64", ""},
		{[]string{"export", "somebox"}, "export: missing -o FILE", ""},
		{[]string{"serve", "--pool", "python:slim=0"}, "serve: --pool \"python:slim=0\": want IMAGE[=N] with N in 1..64", ""},
		{[]string{"run", "-d", "--idle-timeout", "5s", "--idle-action", "suspend", "python:slim", "sleep", "9"}, "run: --idle-action suspend: a box's main command keeps it in use", ""},
		{[]string{"create", "--idle-timeout", "5s", "--idle-action", "stop", "python:slim", "sleep", "9"}, "create: --idle-action stop: a box's main command keeps it in use", ""},
	} {
		_, errs, code := c.run(tc.args...)
		if code != 125 || !strings.Contains(errs, tc.want) || (tc.reject != "" && strings.Contains(errs, tc.reject)) {
			t.Errorf("%v: code %d stderr %q; want 125 with %q", tc.args, code, errs, tc.want)
		}
	}
	if q := qemuOf(c.home); len(q) != 0 {
		t.Fatalf("a flag error started QEMU: %v", q)
	}
}

func TestCLICreateExecStopStartRm(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	out, errs, code := c.run("create", "--name", "keep", "--network", "none", "python:slim")
	id := strings.TrimSpace(out)
	if code != 0 || len(id) != 12 {
		t.Fatalf("create: code %d stdout %q stderr %q", code, out, errs)
	}
	if _, errs, code = c.run("exec", "keep", "sh", "-c", "echo persisted > /root/f"); code != 0 {
		t.Fatalf("exec: %d %q", code, errs)
	}
	if out, _, _ = c.run("ls"); !strings.Contains(out, id) || !strings.Contains(out, "Up ") {
		t.Fatalf("ls: %q", out)
	}
	if _, errs, code = c.run("stop", id[:6]); code != 0 {
		t.Fatalf("stop: %d %q", code, errs)
	}
	if q := qemuOf(c.home); len(q) != 0 {
		t.Fatalf("QEMU still running after stop: %v", q)
	}
	if _, errs, code = c.run("exec", "keep", "true"); code != 125 || !strings.Contains(errs, "not running") {
		t.Fatalf("exec on stopped box: %d %q", code, errs)
	}
	if _, errs, code = c.run("start", "keep"); code != 0 {
		t.Fatalf("start: %d %q", code, errs)
	}
	if out, errs, code = c.run("exec", "keep", "cat", "/root/f"); code != 0 || out != "persisted\n" {
		t.Fatalf("exec after restart: %d %q %q", code, out, errs)
	}
	if out, _, _ = c.run("logs", "--console", "keep"); !strings.Contains(out, "airlock-agent: ready") {
		t.Fatalf("logs: %q", out)
	}
	if _, errs, code = c.run("rm", "keep"); code == 0 || !strings.Contains(errs, "rm -f") {
		t.Fatalf("rm of running box: %d %q", code, errs)
	}
	if _, errs, code = c.run("rm", "-f", "keep"); code != 0 {
		t.Fatalf("rm -f: %d %q", code, errs)
	}
	if q := qemuOf(c.home); len(q) != 0 {
		t.Fatalf("QEMU left behind after rm -f: %v", q)
	}
}

func TestCLIDoctor(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	out, _, code := c.run("doctor")
	if code != 0 || !strings.Contains(out, "kernel") || !strings.Contains(out, "accelerator") {
		t.Fatalf("doctor: %d %q", code, out)
	}
	t.Setenv("AIRLOCK_ACCEL", "bogus")
	cmd := exec.Command(airlockBin, "doctor")
	cmd.Env = append(os.Environ(), "AIRLOCK_ACCEL=bogus")
	b, _ := cmd.CombinedOutput()
	if !strings.Contains(string(b), "want kvm, tcg or auto") {
		t.Fatalf("doctor with bad AIRLOCK_ACCEL: %s", b)
	}
}

func TestCLIRunKilledLeavesNoVM(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	cmd := exec.Command(airlockBin, "run", "--rm", "python:slim", "sh", "-c", "echo up; sleep 600")
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+c.home, "AIRLOCK_IMAGES="+vmtest.ImagesDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "up\n" {
		t.Fatalf("box did not start: %q %v", buf, err)
	}
	if q := qemuOf(c.home); len(q) != 1 {
		t.Fatalf("want one QEMU while running, got %v", q)
	}
	if h := netHelpersOf(c.home); len(h) != 1 {
		t.Fatalf("want one network helper while running, got %v", h)
	}
	cmd.Process.Kill() // SIGKILL: no chance to clean up
	cmd.Wait()
	// The next airlock command removes the orphaned --rm box.
	if out, _, _ := c.run("ls", "-aq"); strings.TrimSpace(out) != "" {
		t.Fatalf("orphaned --rm box still listed: %q", out)
	}
	if q := qemuOf(c.home); len(q) != 0 {
		t.Fatalf("QEMU of a killed run --rm survived: %v", q)
	}
	for i := 0; len(netHelpersOf(c.home)) != 0; i++ {
		if i > 100 {
			t.Fatalf("network helper of a killed run --rm survived: %v", netHelpersOf(c.home))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// netHelpersOf lists network helper processes of boxes under home.
func netHelpersOf(home string) []string {
	out, _ := exec.Command("pgrep", "-f", "airlock-net "+home).Output()
	var pids []string
	for _, p := range strings.Fields(string(out)) {
		st, _ := os.ReadFile("/proc/" + p + "/stat")
		if len(st) > 0 && !strings.Contains(string(st), ") Z ") {
			pids = append(pids, p)
		}
	}
	return pids
}

// keepaliveWindow is how long a host takes to notice a dead agent
// (transport.KeepAliveInterval + KeepAliveTimeout): the longest a box's VM
// may outlive a client that was killed.
const keepaliveWindow = 10 * time.Second

// liveProc reports whether pid runs (a zombie does not: nothing here
// need reap it).
func liveProc(pid string) bool {
	st, err := os.ReadFile("/proc/" + pid + "/stat")
	return err == nil && !strings.Contains(string(st), ") Z ")
}

// boxRecords lists the ids of the box records of home as stored, without
// what opening the runtime does to them (an Open reconciles).
func boxRecords(t *testing.T, home string) []string {
	t.Helper()
	db, err := store.Open(filepath.Join(home, "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	recs, err := db.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return ids
}

// The VM of a killed `airlock run --rm` ends on its own within the
// keepalive window, with nothing of airlock running; and no VM of the
// home runs at any moment while its box is not listed (its record goes
// only after the VM): counted by /proc state for 15 s.
func TestCLIRunKilledVMGoesWithItsRecord(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	t.Cleanup(func() { vmtest.KillHome(c.home) })
	cmd := exec.Command(airlockBin, "run", "--rm", "--network", "disabled", "python:slim", "sh", "-c", "echo up; exec sleep 600")
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+c.home, "AIRLOCK_IMAGES="+vmtest.ImagesDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "up\n" {
		t.Fatalf("box did not start: %q %v", buf, err)
	}
	q := qemuOf(c.home)
	if len(q) != 1 {
		t.Fatalf("want one QEMU while running, got %v", q)
	}
	cmd.Process.Kill() // SIGKILL: no chance to clean up
	cmd.Wait()
	t0 := time.Now()
	// Until the window is over nothing of airlock runs (every airlock
	// command reconciles the home): the records are read from the store.
	gone := time.Duration(-1)
	for time.Since(t0) < keepaliveWindow {
		recs := boxRecords(t, c.home)
		if liveProc(q[0]) {
			if len(recs) == 0 {
				t.Fatalf("QEMU %s runs %s after its client was killed while no box is recorded", q[0], time.Since(t0).Round(time.Millisecond))
			}
		} else if gone < 0 {
			gone = time.Since(t0)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if gone < 0 {
		t.Fatalf("QEMU %s of a killed run --rm still runs %s after the kill (its client's keepalive window)", q[0], keepaliveWindow)
	}
	t.Logf("QEMU gone %s after its client was killed", gone.Round(time.Millisecond))
	// Then as a user sees it: ls -a lists no box (the next airlock
	// command removes the dead client's box), and no VM of the home runs
	// while none is listed.
	for time.Since(t0) < 15*time.Second {
		listed, _, _ := c.run("ls", "-aq")
		if live := qemuOf(c.home); len(live) > 0 && strings.TrimSpace(listed) == "" {
			t.Fatalf("QEMU %v runs while ls -a lists no box", live)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if listed, _, _ := c.run("ls", "-aq"); strings.TrimSpace(listed) != "" {
		t.Fatalf("the killed client's --rm box is still listed: %q", listed)
	}
}
