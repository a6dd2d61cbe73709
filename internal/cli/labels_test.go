package cli_test

import (
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestCLILabels: create --label, ls --filter label=, inspect's labels.
func TestCLILabels(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	out, errs, code := c.run("create", "--quiet", "--network", "none", "--label", "team=a", "-l", "tier=gold", "python:slim")
	if code != 0 {
		t.Fatalf("create --label: %d %q", code, errs)
	}
	id := strings.TrimSpace(out)
	defer c.run("rm", "-f", id)
	if _, errs, code := c.run("create", "--label", "novalue", "python:slim"); code == 0 || !strings.Contains(errs, "KEY=VALUE") {
		t.Errorf("--label without =: %d %q", code, errs)
	}
	for filter, want := range map[string]string{"label=team=a": id, "label=tier": id, "label=team=b": ""} {
		if out, errs, code := c.run("ls", "-q", "--filter", filter); code != 0 || strings.TrimSpace(out) != want {
			t.Errorf("ls --filter %s: %d %q %q, want %q", filter, code, out, errs, want)
		}
	}
	if out, _, _ := c.run("inspect", "--format", "{{.Config.Labels.team}} {{.Config.Labels.tier}}", id); strings.TrimSpace(out) != "a gold" {
		t.Errorf("inspect labels: %q", out)
	}
}

// TestCLIInspectIdle: inspect shows a box's idle settings (and none for a
// box without an idle timeout).
func TestCLIInspectIdle(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	out, errs, code := c.run("create", "--quiet", "--network", "none", "--idle-timeout", "90m", "--idle-action", "suspend", "python:slim")
	if code != 0 {
		t.Fatalf("create --idle-timeout: %d %q", code, errs)
	}
	id := strings.TrimSpace(out)
	defer c.run("rm", "-f", id)
	format := "{{.Config.IdleTimeout}}|{{.Config.IdleAction}}|{{.State.IdleDeadline.IsZero}}"
	if out, errs, _ := c.run("inspect", "--format", format, id); strings.TrimSpace(out) != "1h30m0s|suspend|false" {
		t.Errorf("inspect idle settings: %q %q, want 1h30m0s|suspend|false", out, errs)
	}
	out, errs, code = c.run("create", "--quiet", "--network", "none", "python:slim")
	if code != 0 {
		t.Fatalf("create: %d %q", code, errs)
	}
	plain := strings.TrimSpace(out)
	defer c.run("rm", "-f", plain)
	if out, errs, _ := c.run("inspect", "--format", format, plain); strings.TrimSpace(out) != "||true" {
		t.Errorf("inspect without an idle timeout: %q %q, want ||true", out, errs)
	}
}
