package cli_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// Tests of the verbs and flags docker users reach for (issue 14), each
// running the airlock binary as a separate process.

// TestCLIUsageErrors: every usage error exits 125 before anything boots,
// names what is missing or wrong, and shows no Go identifiers.
func TestCLIUsageErrors(t *testing.T) {
	c := cli{t, t.TempDir()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exec"}, "exec: missing BOX"},
		{[]string{"exec", "somebox"}, "exec: missing COMMAND"},
		{[]string{"run"}, "run: missing IMAGE"},
		{[]string{"rm"}, "rm: missing BOX"},
		{[]string{"logs"}, "logs: missing BOX"},
		{[]string{"inspect"}, "inspect: missing BOX|IMAGE"},
		{[]string{"save"}, "save: missing IMAGE"},
		{[]string{"ls", "extra"}, `ls: unexpected argument "extra"`},
		{[]string{"images", "a", "b"}, `images: unexpected argument "b"`},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"image", "frobnicate"}, `image: unknown command "frobnicate"`},
		{[]string{"system", "frobnicate"}, `system: unknown command "frobnicate"`},
		{[]string{"ls", "--bogus"}, "ls: unknown flag: --bogus"},
		{[]string{"stop", "--bogus", "x"}, "stop: unknown flag: --bogus"},
		{[]string{"run", "--cpus", "abc", "python:slim"}, `run: invalid value "abc" for --cpus`},
		{[]string{"create", "-m", "lots", "python:slim"}, `--memory "lots": want a size such as 512m or 2g`},
		{[]string{"create", "--hostname", "bad_name!", "python:slim"}, `hostname "bad_name!"`},
		{[]string{"logs", "--since", "yesterday", "x"}, `--since "yesterday"`},
		{[]string{"inspect", "--type", "volume", "x"}, `--type "volume": want box or image`},
		{[]string{"ls", "-a", "--format", "{{.ID"}, "--format:"},
	} {
		_, errs, code := c.run(tc.args...)
		if code != 125 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 125 and %q", tc.args, code, errs, tc.want)
		}
		for _, goWord := range []string{"strconv.", "Box.", "cli.", "requires at least", "accepts "} {
			if strings.Contains(errs, goWord) {
				t.Errorf("%v: stderr %q shows %q", tc.args, errs, goWord)
			}
		}
		if strings.Contains(errs, "warning") {
			t.Errorf("%v: a usage error printed a warning: %q", tc.args, errs)
		}
	}
	if q := qemuOf(c.home); len(q) != 0 {
		t.Fatalf("a usage error started QEMU: %v", q)
	}
}

// TestCLIEnvFileAndMemoryUnits: --env-file and -m units reach the box.
// (Checked without booting: a bad file is refused with its line.)
func TestCLIEnvFileRefusesBadLine(t *testing.T) {
	c := cli{t, t.TempDir()}
	f := c.home + "/env"
	os.WriteFile(f, []byte("# comment\nA=1\n\n=bad\n"), 0o600)
	_, errs, code := c.run("run", "--env-file", f, "python:slim", "true")
	if code != 125 || !strings.Contains(errs, "line 4") {
		t.Fatalf("exit %d stderr %q", code, errs)
	}
}

// tcgExpected says whether boxes here get the TCG warning: they run under
// TCG and AIRLOCK_ACCEL did not ask for it.
func tcgExpected(t *testing.T, c cli) bool {
	out, _, _ := c.run("doctor")
	return strings.Contains(out, "TCG software emulation") && os.Getenv("AIRLOCK_ACCEL") == ""
}

// boxRow is the part of ls --format json the tests read.
type boxRow struct {
	ID, Name, State, Status, Reason string
	ExitCode                        int
}

func lsAll(t *testing.T, c cli) map[string]boxRow {
	t.Helper()
	out, errs, code := c.run("ls", "-a", "--format", "json")
	if code != 0 {
		t.Fatalf("ls -a --format json: %d %q", code, errs)
	}
	rows := map[string]boxRow{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var r boxRow
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("ls --format json line %q: %v", line, err)
		}
		rows[r.Name] = r
	}
	return rows
}

// TestCLIBoxStates boots four small boxes in one home and checks what a
// docker user reads off them: run's exit recorded as "Exited (N)", run -d
// with logs, a stopped box, a box whose VM was killed; ls vs ls -a;
// inspect JSON and templates; completion of box and image names; the TCG
// warning once per box start, none with --quiet or for a failed command.
func TestCLIBoxStates(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	tcg := tcgExpected(t, c)
	warnings := func(s string) int { return strings.Count(s, "airlock: warning: KVM is not usable") }

	// run: the command's exit is the box's; --quiet: no warning.
	out, errs, code := c.run("run", "--quiet", "--name", "r3", "--network", "disabled", "python:slim", "sh", "-c", "echo out; exit 3")
	if code != 3 || out != "out\n" || warnings(errs) != 0 {
		t.Fatalf("run: exit %d stdout %q stderr %q", code, out, errs)
	}
	if out, _, _ = c.run("logs", "r3"); out != "out\n" {
		t.Fatalf("logs of a run box: %q", out)
	}
	if all, _, _ := c.run("logs", "--console", "r3"); !strings.Contains(all, "airlock-agent: ready") || strings.Count(all, "\n") < 2 {
		t.Fatalf("logs --console: %q", all)
	} else if out, _, _ = c.run("logs", "--console", "--tail", "1", "r3"); strings.Count(out, "\n") != 1 || !strings.HasSuffix(all, out) {
		t.Fatalf("logs --console --tail 1: %q of %q", out, all)
	}
	// A main command the guest's OOM killer takes: "OOM killed". Large
	// allocations: 1 MiB ones make the exec cgroup reclaim page cache for
	// minutes under TCG before the OOM kill.
	_, errs, code = c.run("run", "--quiet", "--name", "oom", "-m", "128m", "--network", "disabled", "python:slim",
		"python3", "-c", "x = []\nwhile True: x.append(bytearray(32 << 20))")
	if code != 137 {
		t.Fatalf("run out of memory: exit %d stderr %q", code, errs)
	}
	// A failing command boots nothing and warns about nothing.
	if _, errs, code = c.run("run", "--name", "r3", "python:slim", "true"); code != 125 || warnings(errs) != 0 || !strings.Contains(errs, "name already in use") {
		t.Fatalf("run with a taken name: exit %d stderr %q", code, errs)
	}
	// run -d: prints the id at once; the command goes on; one warning.
	out, errs, code = c.run("run", "-d", "--name", "d", "--network", "disabled", "-m", "256m", "--hostname", "h-1",
		"python:slim", "sh", "-c", "echo hello; echo oops >&2; hostname; sleep 1; exit 5")
	id := strings.TrimSpace(out)
	if code != 0 || len(id) != 12 {
		t.Fatalf("run -d: exit %d stdout %q stderr %q", code, out, errs)
	}
	if want := map[bool]int{true: 1, false: 0}[tcg]; warnings(errs) != want {
		t.Fatalf("run -d printed %d TCG warnings, want %d: %q", warnings(errs), want, errs)
	}
	cmd := exec.Command(airlockBin, "logs", "-f", "d")
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+c.home, "AIRLOCK_IMAGES="+vmtest.ImagesDir())
	var lo, le strings.Builder
	cmd.Stdout, cmd.Stderr = &lo, &le
	done := make(chan error, 1)
	go func() { done <- cmd.Run() }()
	select {
	case err := <-done:
		if err != nil || lo.String() != "hello\nh-1\n" || le.String() != "oops\n" {
			t.Fatalf("logs -f: %v stdout %q stderr %q", err, lo.String(), le.String())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("logs -f did not end with the main command: %q", lo.String())
	}
	if out, _, _ = c.run("logs", "--tail", "1", "d"); out != "h-1\n" {
		t.Fatalf("logs --tail 1: %q", out)
	}
	if out, _, _ = c.run("logs", "--since", "1h", "d"); out != "hello\nh-1\n" {
		t.Fatalf("logs --since 1h: %q", out)
	}
	// start runs the main command again; its output is appended.
	if _, errs, code = c.run("start", "d"); code != 0 {
		t.Fatalf("start d: %d %q", code, errs)
	}
	if out, errs, code = c.run("logs", "-f", "d"); code != 0 || out != "hello\nh-1\nhello\nh-1\n" {
		t.Fatalf("logs -f after start: %d %q %q", code, out, errs)
	}

	// create: a box that keeps running; one that is stopped; one whose VM
	// is killed.
	if _, errs, code := c.run("create", "--quiet", "--name", "k", "--network", "disabled", "python:slim"); code != 0 {
		t.Fatalf("create k: %d %q", code, errs)
	}
	// TCG chosen with AIRLOCK_ACCEL=tcg: no warning.
	t.Setenv("AIRLOCK_ACCEL", "tcg")
	_, errs, code = c.run("create", "--name", "s", "--network", "disabled", "python:slim")
	os.Unsetenv("AIRLOCK_ACCEL")
	if code != 0 || strings.Contains(errs, "warning") {
		t.Fatalf("create s with AIRLOCK_ACCEL=tcg: %d %q", code, errs)
	}
	if out, _, _ = c.run("ls", "--format", "{{.Name}}"); strings.Fields(out)[0] != "k" || len(strings.Fields(out)) != 2 {
		t.Fatalf("ls (running only): %q", out)
	}
	// Completion offers the running boxes for exec, the images for run.
	if out, _, _ = c.run("__complete", "exec", ""); !strings.Contains(out, "k\t") || !strings.Contains(out, "s\t") || strings.Contains(out, "r3") {
		t.Fatalf("completion of exec: %q", out)
	}
	if out, _, _ = c.run("__complete", "run", "py"); !strings.Contains(out, "python:slim") {
		t.Fatalf("completion of run: %q", out)
	}
	if _, errs, code = c.run("stop", "s"); code != 0 {
		t.Fatalf("stop: %d %q", code, errs)
	}
	pid, _, _ := c.run("inspect", "-f", "{{.State.Pid}}", "k")
	if err := exec.Command("kill", "-9", strings.TrimSpace(pid)).Run(); err != nil {
		t.Fatalf("kill QEMU %q: %v", pid, err)
	}
	time.Sleep(300 * time.Millisecond)

	rows := lsAll(t, c)
	for name, want := range map[string]struct{ reason, status string }{
		"r3":  {"exited", "Exited (3) "},
		"d":   {"exited", "Exited (5) "},
		"s":   {"stopped", "Stopped "},
		"k":   {"vm-died", "VM died "},
		"oom": {"oom-killed", "OOM killed (137) "},
	} {
		r := rows[name]
		if r.State != "stopped" || r.Reason != want.reason || !strings.HasPrefix(r.Status, want.status) {
			t.Errorf("ls -a: %s is %+v; want reason %s, status %q...", name, r, want.reason, want.status)
		}
	}
	if out, _, _ = c.run("ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("ls lists stopped boxes: %q", out)
	}
	if out, _, _ = c.run("ls", "-aq"); len(strings.Fields(out)) != 5 {
		t.Errorf("ls -aq: %q", out)
	}

	// inspect: a JSON array that round-trips, with the state and config.
	out, errs, code = c.run("inspect", "d", "k", "python:slim")
	var objs []map[string]any
	if err := json.Unmarshal([]byte(out), &objs); code != 0 || err != nil || len(objs) != 3 {
		t.Fatalf("inspect: exit %d, %v, stdout %q stderr %q", code, err, out, errs)
	}
	st := objs[0]["State"].(map[string]any)
	cfg := objs[0]["Config"].(map[string]any)
	if objs[0]["ID"] != id || st["Reason"] != "exited" || st["ExitCode"] != 5.0 || st["FinishedAt"] == "" ||
		cfg["MemoryMiB"] != 256.0 || cfg["Hostname"] != "h-1" || cfg["Cmd"].([]any)[0] != "sh" {
		t.Errorf("inspect d: %v", objs[0])
	}
	if st := objs[1]["State"].(map[string]any); st["Died"] != true || !strings.Contains(st["DiedCause"].(string), "QEMU") {
		t.Errorf("inspect k: %v", st)
	}
	if objs[2]["Type"] != "image" || !strings.HasPrefix(objs[2]["ID"].(string), "sha256:") {
		t.Errorf("inspect python:slim: %v", objs[2])
	}
	if out, _, _ = c.run("inspect", "--format", "{{.State.ExitCode}} {{.Config.CPUs}}", "r3"); out != "3 1\n" {
		t.Errorf("inspect --format: %q", out)
	}
	if _, errs, code = c.run("inspect", "nope"); code != 1 || !strings.Contains(errs, `no box or image "nope"`) {
		t.Errorf("inspect nope: %d %q", code, errs)
	}
	for _, n := range []string{"r3", "oom", "d", "k", "s"} {
		c.run("rm", "-f", n)
	}
}

// TestCLIManage: stats, top, rename, stop -t, system df, prune and
// version on one box.
func TestCLIManage(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	if _, errs, code := c.run("create", "--quiet", "--name", "m", "--network", "disabled", "-m", "256m", "python:slim"); code != 0 {
		t.Fatalf("create: %d %q", code, errs)
	}
	out, errs, code := c.run("stats", "--no-stream", "--format", "json")
	var st struct {
		Name               string
		MemUsage, MemLimit int64
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.Name != "m" || st.MemLimit != 256<<20 || st.MemUsage <= 0 {
		t.Fatalf("stats --no-stream: %d %v %q %q", code, err, out, errs)
	}
	if out, errs, code = c.run("top", "m"); code != 0 || !strings.Contains(out, "/init") || !strings.Contains(out, "PID") {
		t.Fatalf("top: %d %q %q", code, out, errs)
	}
	// A 5th process waits for one of the box's 4 agent connections, and
	// says so (boxes reached over vsock have no such limit).
	id, _, _ := c.run("inspect", "-f", "{{.ID}}", "m")
	if _, err := os.Stat(filepath.Join(c.home, "boxes", strings.TrimSpace(id), "vsock.cid")); err != nil {
		var busy []*exec.Cmd
		for i := 0; i < 4; i++ {
			b := exec.Command(airlockBin, "exec", "m", "sleep", "3")
			b.Env = append(os.Environ(), "AIRLOCK_HOME="+c.home, "AIRLOCK_IMAGES="+vmtest.ImagesDir())
			if err := b.Start(); err != nil {
				t.Fatal(err)
			}
			busy = append(busy, b)
		}
		time.Sleep(1500 * time.Millisecond)
		_, errs, code = c.run("exec", "m", "true")
		for _, b := range busy {
			b.Wait()
		}
		if code != 0 || strings.Count(errs, "all 4 of its agent connections are in use") != 1 {
			t.Fatalf("5th exec: %d %q", code, errs)
		}
	}
	if _, errs, code = c.run("rename", "m", "m2"); code != 0 {
		t.Fatalf("rename: %d %q", code, errs)
	}
	if out, _, _ = c.run("inspect", "-f", "{{.Name}} {{.State.Status}}", "m2"); out != "m2 running\n" {
		t.Fatalf("inspect after rename: %q", out)
	}
	start := time.Now()
	if _, errs, code = c.run("stop", "-t", "0", "m2"); code != 0 || time.Since(start) > 8*time.Second {
		t.Fatalf("stop -t 0: %d %q after %s", code, errs, time.Since(start))
	}
	out, _, _ = c.run("system", "df", "--format", "{{.Type}}={{.Total}}/{{.Active}}")
	if !strings.Contains(out, "Boxes=1/0") || !strings.Contains(out, "Images=") || !strings.Contains(out, "Snapshots=0/0") {
		t.Fatalf("system df: %q", out)
	}
	if _, errs, code = c.run("prune"); code != 125 || !strings.Contains(errs, "add -f") {
		t.Fatalf("prune without -f off a terminal: %d %q", code, errs)
	}
	if out, errs, code = c.run("prune", "-f"); code != 0 || !strings.Contains(out, "Deleted boxes:") || !strings.Contains(out, "Total reclaimed space:") {
		t.Fatalf("prune -f: %d %q %q", code, out, errs)
	}
	if out, _, _ = c.run("ls", "-aq"); strings.TrimSpace(out) != "" {
		t.Fatalf("boxes left after prune: %q", out)
	}
	var v map[string]any
	out, _, code = c.run("version", "--format", "json")
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v["Protocol"] == "" || v["QEMU"] == "" || v["Kernel"] == "" {
		t.Fatalf("version: %d %v %q", code, err, out)
	}
	if out, _, code = c.run("--version"); code != 0 || !strings.HasPrefix(out, "airlock version ") {
		t.Fatalf("--version: %d %q", code, out)
	}
}

// TestCLIBenchPrintsMeasurementsOnly: bench prints what it measured; the
// project's targets and verdicts only with --targets.
func TestCLIBenchPrintsMeasurementsOnly(t *testing.T) {
	vmtest.Require(t)
	if testing.Short() {
		t.Skip("bench boots several VMs")
	}
	k, _, err := assets.FindKernel("")
	if err != nil {
		t.Fatal(err)
	}
	c := cli{t, t.TempDir()}
	out, errs, code := c.run("bench", "--runs", "1", "--kernel", k.Path)
	if code != 0 || !strings.Contains(out, "cold start") || !strings.Contains(out, "bare limit") {
		t.Fatalf("bench: %d %q %q", code, out, errs)
	}
	for _, verdict := range []string{"met", "missed", "target", "≤"} {
		if strings.Contains(out, verdict) {
			t.Errorf("bench without --targets shows %q:\n%s", verdict, out)
		}
	}
}

// TestCLIDoctorFixMatchesCause: a bad AIRLOCK_KERNEL is reported with a
// fix about AIRLOCK_KERNEL, not "run hack/setup.sh".
func TestCLIDoctorFixMatchesCause(t *testing.T) {
	cmd := exec.Command(airlockBin, "doctor")
	cmd.Env = append(os.Environ(), "AIRLOCK_KERNEL=/nonexistent/vmlinux", "AIRLOCK_HOME="+t.TempDir())
	b, _ := cmd.CombinedOutput()
	out := string(b)
	i := strings.Index(out, "PROBLEM  kernel")
	if i < 0 {
		t.Fatalf("no kernel problem reported:\n%s", out)
	}
	fix := strings.SplitN(out[i:], "\n", 3)[1]
	if !strings.Contains(fix, "AIRLOCK_KERNEL=/nonexistent/vmlinux is wrong: unset it") || strings.Contains(fix, "hack/setup.sh (or") {
		t.Fatalf("kernel fix %q", fix)
	}
}

// TestCLIPauseToDiskRefusesMainCommand: pause --to-disk of a box whose
// main command the CLI follows (run -d) is refused with a message saying
// what to do, and the box runs on; pause in memory works.
func TestCLIPauseToDiskRefusesMainCommand(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	if out, errs, code := c.run("run", "-d", "--quiet", "--name", "sup", "--network", "disabled", "python:slim", "sleep", "infinity"); code != 0 {
		t.Fatalf("run -d: exit %d %q %q", code, out, errs)
	}
	defer c.run("rm", "-f", "sup")
	if _, errs, code := c.run("pause", "--to-disk", "sup"); code == 0 || !strings.Contains(errs, "main command") || !strings.Contains(errs, "airlock pause") {
		t.Fatalf("pause --to-disk of a run -d box: exit %d %q, want a refusal naming its main command", code, errs)
	}
	if out, errs, code := c.run("exec", "sup", "echo", "up"); code != 0 || out != "up\n" {
		t.Fatalf("exec after the refusal: exit %d %q %q", code, out, errs)
	}
	if _, errs, code := c.run("pause", "sup"); code != 0 {
		t.Fatalf("pause: exit %d %q", code, errs)
	}
	if out, _, _ := c.run("inspect", "-f", "{{.State.Paused}} {{.State.PausedToDisk}}", "sup"); out != "true false\n" {
		t.Errorf("inspect of a paused box: %q", out)
	}
	if _, errs, code := c.run("unpause", "sup"); code != 0 {
		t.Fatalf("unpause: exit %d %q", code, errs)
	}
}
