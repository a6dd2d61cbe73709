package cli_test

import (
	"archive/tar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/vmtest"
)

// The "done when": cp a CSV in, a result out; tar streams with "-".
func TestCLICp(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	id, errs, code := c.run("create", "--network", "disabled", "python:slim")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errs)
	}
	id = strings.TrimSpace(id)
	t.Cleanup(func() { c.run("rm", "-f", id) })
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "data.csv"), []byte("a,b\n1,2\n"), 0o644)
	if _, errs, code := c.run("exec", id, "mkdir", "/data"); code != 0 {
		t.Fatal(errs)
	}
	if _, errs, code := c.run("cp", filepath.Join(dir, "data.csv"), id+":/data/"); code != 0 {
		t.Fatalf("cp in: %d %s", code, errs)
	}
	if _, errs, code := c.run("exec", id, "sh", "-c", "cut -d, -f2 /data/data.csv > /data/out.txt"); code != 0 {
		t.Fatal(errs)
	}
	out := filepath.Join(dir, "out")
	os.Mkdir(out, 0o755)
	if _, errs, code := c.run("cp", id+":/data/out.txt", out); code != 0 {
		t.Fatalf("cp out: %d %s", code, errs)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "out.txt")); string(b) != "b\n2\n" {
		t.Fatalf("out.txt: %q", b)
	}
	// A tar stream out, and back in.
	tarOut, errs, code := c.run("cp", id+":/data", "-")
	if code != 0 {
		t.Fatalf("cp out -: %d %s", code, errs)
	}
	list := exec.Command("tar", "-t")
	list.Stdin = strings.NewReader(tarOut)
	if b, err := list.Output(); err != nil || string(b) != "data/\ndata/data.csv\ndata/out.txt\n" {
		t.Fatalf("tar -t: %q %v", b, err)
	}
	cmd := exec.Command(airlockBin, "cp", "-", id+":/tmp")
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+c.home, "AIRLOCK_IMAGES="+vmtest.ImagesDir())
	cmd.Stdin = strings.NewReader(tarOut)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cp - : %v %s", err, b)
	}
	if o, _, _ := c.run("exec", id, "cat", "/tmp/data/out.txt"); o != "b\n2\n" {
		t.Fatalf("after cp -: %q", o)
	}
	// A box that refuses the copy (a read-only destination) ends `cp -`
	// at once with its error, though stdin stalls and never closes.
	if _, errs, code := c.run("exec", id, "sh", "-c", "mkdir /rodst && mount -t tmpfs -o ro tmpfs /rodst"); code != 0 {
		t.Fatal(errs)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	stalled := exec.Command(airlockBin, "cp", "-", id+":/rodst")
	stalled.Env = cmd.Env
	stalled.Stdin = pr
	var stalledErr strings.Builder
	stalled.Stderr = &stalledErr
	if err := stalled.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	tw := tar.NewWriter(pw)
	tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: 3 << 20, Typeflag: tar.TypeReg})
	tw.Write(make([]byte, 4<<10))
	exited := make(chan error, 1)
	go func() { exited <- stalled.Wait() }()
	select {
	case err := <-exited:
		if err == nil || !strings.Contains(stalledErr.String(), "read-only file system") {
			t.Errorf("cp - into a read-only directory: %v %q", err, stalledErr.String())
		}
	case <-time.After(20 * time.Second):
		stalled.Process.Kill()
		t.Fatalf("cp - still runs 20 s after the box refused the copy (stdin stalled)")
	}
	// A stopped box: started for the copy, stopped again, files kept.
	if _, errs, code := c.run("stop", id); code != 0 {
		t.Fatal(errs)
	}
	back := filepath.Join(dir, "stopped")
	if _, errs, code := c.run("cp", id+":/data/out.txt", back); code != 0 {
		t.Fatalf("cp from a stopped box: %d %s", code, errs)
	}
	if b, _ := os.ReadFile(back); string(b) != "b\n2\n" {
		t.Fatalf("from the stopped box: %q", b)
	}
	if ls, _, _ := c.run("ls", "-a"); !strings.Contains(ls, "Stopped") {
		t.Errorf("box not stopped again: %s", ls)
	}
	c.run("start", id)
	// Errors name the path and fail.
	if _, errs, code := c.run("cp", id+":/no/such", dir); code == 0 || !strings.Contains(errs, "/no/such") {
		t.Errorf("missing source: %d %q", code, errs)
	}
}
