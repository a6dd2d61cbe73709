package cli_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestCLICommitExportImport: commit and export of a stopped box, 'airlock
// images' showing the commit, 'airlock import' telling a box archive from
// an image archive and making a stopped box that boots with the files.
func TestCLICommitExportImport(t *testing.T) {
	vmtest.Require(t)
	home := t.TempDir()
	// A store of its own (hard links to the shared blobs): the commit
	// must not land in the shared image store.
	images := filepath.Join(t.TempDir(), "images")
	if out, err := exec.Command("cp", "-al", vmtest.ImagesDir(), images).CombinedOutput(); err != nil {
		t.Fatalf("cp -al: %v: %s", err, out)
	}
	idx := filepath.Join(images, "index.json")
	b, _ := os.ReadFile(idx)
	os.Remove(idx)
	os.WriteFile(idx, b, 0o644)
	run := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(airlockBin, args...)
		cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+images)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	must := func(args ...string) string {
		t.Helper()
		out, errs, code := run(args...)
		if code != 0 {
			t.Fatalf("airlock %s: exit %d: %s", strings.Join(args, " "), code, errs)
		}
		return out
	}
	must("create", "--name", "src", "--network", "none", "python:slim")
	must("exec", "src", "sh", "-c", "echo made > /root/made && rm /etc/issue")
	must("stop", "src")

	out, errs, code := run("commit", "src", "mytools:v1", "-m", "from the test")
	if code != 0 || !strings.HasPrefix(out, "sha256:") || !strings.Contains(errs, "1 whiteouts") {
		t.Fatalf("commit: %d %q %q", code, out, errs)
	}
	if ls := must("images"); !strings.Contains(ls, "mytools") || !strings.Contains(ls, "committed from box") {
		t.Errorf("images does not list the commit:\n%s", ls)
	}
	if _, errs, code := run("commit", "src", "Not A Name!"); code == 0 {
		t.Errorf("commit to a bad name succeeded: %q", errs)
	}

	archive := filepath.Join(t.TempDir(), "box.tar")
	if _, errs, code := run("export", "src"); code == 0 || !strings.Contains(errs, "-o FILE") {
		t.Errorf("export without -o: %d %q", code, errs)
	}
	must("export", "src", "-o", archive)
	if _, errs, code := run("export", "src", "--with-memory", "-o", archive+".m"); code == 0 || !strings.Contains(errs, "not running") {
		t.Errorf("export --with-memory of a stopped box: %d %q", code, errs)
	}
	id := strings.TrimSpace(must("import", archive, "--name", "copy"))
	if len(id) != 12 {
		t.Fatalf("import printed %q", id)
	}
	if ps := must("ls", "-a"); !strings.Contains(ps, "copy") {
		t.Errorf("ls -a:\n%s", ps)
	}
	must("start", "copy")
	if got := must("exec", "copy", "sh", "-c", "cat /root/made; ls /etc/issue 2>&1 || true"); !strings.HasPrefix(got, "made\n") || !strings.Contains(got, "No such file") {
		t.Errorf("imported box: %q", got)
	}
	// An image archive still goes to the image import.
	saved := filepath.Join(t.TempDir(), "img.tar")
	must("save", "mytools:v1", "-o", saved)
	if out := must("import", saved, "--tag", "again:v1"); !strings.Contains(out, "Imported") {
		t.Errorf("image import: %q", out)
	}
	must("rm", "-f", "src", "copy")
	must("rmi", "mytools:v1", "again:v1")
}
