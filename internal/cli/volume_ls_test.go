package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// volume ls and snapshot ls take -q and --format as ls and images do, and
// volume names complete. No VM: a named volume is an ext4 image on the host.
func TestCLIVolumeAndSnapshotListFormats(t *testing.T) {
	c := cli{t, t.TempDir()}
	if _, errs, code := c.run("volume", "create", "tvol", "--size", "16"); code != 0 {
		t.Fatalf("volume create: %d %s", code, errs)
	}
	if out, _, code := c.run("volume", "ls", "-q"); code != 0 || out != "tvol\n" {
		t.Fatalf("volume ls -q: %d %q", code, out)
	}
	out, _, code := c.run("volume", "ls", "--format", "json")
	var v struct {
		Name    string
		SizeMiB int
	}
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Name != "tvol" || v.SizeMiB != 16 {
		t.Fatalf("volume ls --format json: %d %q %v", code, out, err)
	}
	if out, _, _ := c.run("volume", "ls", "--format", "{{.Name}}:{{.SizeMiB}}"); out != "tvol:16\n" {
		t.Fatalf("volume ls --format template: %q", out)
	}
	if out, _, _ := c.run("__complete", "volume", "rm", "tv"); !strings.HasPrefix(out, "tvol\n") {
		t.Fatalf("completion of volume names: %q", out)
	}
	if out, _, code := c.run("snapshot", "ls", "-q"); code != 0 || out != "" {
		t.Fatalf("snapshot ls -q with none: %d %q", code, out)
	}
	if out, _, code := c.run("snapshot", "ls"); code != 0 || !strings.HasPrefix(out, "NAME") {
		t.Fatalf("snapshot ls: %d %q", code, out)
	}
}
