package cli_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/vmtest"
)

// checkpoint create|ls|rm and rollback: a rollback brings the file back,
// a checkpoint after it is a branch (ls --tree draws it, '*' at the
// current one), bad names are refused, rm of a parent keeps its child.
func TestCLICheckpointRollback(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	out, errs, code := c.run("create", "--name", "ck", "--network", "none", "python:slim")
	if code != 0 {
		t.Fatalf("create: %d %q %q", code, out, errs)
	}
	defer c.run("rm", "-f", "ck")
	step := func(args ...string) string {
		t.Helper()
		out, errs, code := c.run(args...)
		if code != 0 {
			t.Fatalf("%v: %d %q %q", args, code, out, errs)
		}
		return out
	}
	step("exec", "ck", "sh", "-c", "echo a > /root/f")
	if out := step("checkpoint", "create", "ck", "A"); out != "A\n" {
		t.Fatalf("checkpoint create: %q", out)
	}
	step("exec", "ck", "sh", "-c", "echo b > /root/f")
	step("checkpoint", "create", "ck", "B")
	if _, errs, code := c.run("checkpoint", "create", "ck", "../x"); code == 0 || !strings.Contains(errs, "checkpoint name") {
		t.Fatalf("bad name: %d %q", code, errs)
	}
	step("rollback", "ck", "A")
	if out := step("exec", "ck", "cat", "/root/f"); out != "a\n" {
		t.Fatalf("after rollback: %q", out)
	}
	step("checkpoint", "create", "ck", "C")
	if out := step("checkpoint", "ls", "--tree", "ck"); out != "A\n├─ B\n└─ C *\n" {
		t.Fatalf("ls --tree:\n%s", out)
	}
	if _, errs, code := c.run("rollback", "ck", "nope"); code == 0 || !strings.Contains(errs, "checkpoint not found") {
		t.Fatalf("rollback to a missing checkpoint: %d %q", code, errs)
	}
	step("checkpoint", "rm", "ck", "A")
	if out := step("checkpoint", "ls", "-q", "ck"); out != "B\nC\n" {
		t.Fatalf("ls -q after rm A: %q", out)
	}
	if out := step("checkpoint", "ls", "ck"); !strings.HasPrefix(out, "CURRENT") || !regexp.MustCompile(`(?m)^\*\s+C\s`).MatchString(out) {
		t.Fatalf("ls:\n%s", out)
	}
}
