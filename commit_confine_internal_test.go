package airlock

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/rootfs"
)

// TestHostileGuestCommitToolsConfined: the e2fsprogs a commit runs on a
// box's disk (which the guest wrote) run as a box uid of their own, with
// no capability (bounding set included), no_new_privs, a seccomp filter
// (no signals to any process, itself included, here), resource limits,
// an empty network namespace and none of the caller's secrets; and the
// layer still comes out right.
func TestHostileGuestCommitToolsConfined(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("confined tools need root (a box uid)")
	}
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("no debugfs (e2fsprogs)")
	}
	t.Setenv("AIRLOCK_TOKEN", "host-token-x")
	r := &Runtime{}
	tool, err := r.diskTool()
	if err != nil {
		t.Fatal(err)
	}
	// What such a tool sees, from a working directory whose parent only
	// root may enter.
	parent := t.TempDir()
	dir := filepath.Join(parent, "work")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "in"), []byte("disk\n"), 0o600)
	cmd := exec.Command("/bin/sh", "-c", `id -u; id -g; cat in; grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status; kill -0 $$ 2>/dev/null && echo kill: ok || echo kill: EPERM; tail -n +3 /proc/self/net/dev | cut -d: -f1 | tr -d ' '; ulimit -v; echo "token=$AIRLOCK_TOKEN"; echo out > out`)
	cmd.Dir = dir
	if err := tool(cmd); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 2 || lines[0] == "0" || lines[0] != lines[1] {
		t.Errorf("tool runs as uid %q gid %q, want a box uid", lines[0], lines[1])
	}
	got := string(out)
	for _, want := range []string{"disk\n", "CapInh:\t0000000000000000\n", "CapPrm:\t0000000000000000\n", "CapEff:\t0000000000000000\n",
		"CapBnd:\t0000000000000000\n", "CapAmb:\t0000000000000000\n", "NoNewPrivs:\t1\n", "Seccomp:\t2\n", "kill: EPERM\n", "\nlo\n", "4194304\n", "token=\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("tool output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "eth") || strings.Contains(got, "host-token-x") {
		t.Errorf("tool sees a host network device or the token:\n%s", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out")); err != nil || string(b) != "out\n" {
		t.Errorf("tool's file in its directory: %q %v", b, err)
	}

	// A commit's read of a disk through it.
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "upper", "d"), 0o755)
	os.MkdirAll(filepath.Join(src, "work"), 0o755)
	os.WriteFile(filepath.Join(src, "upper", "d", "f.txt"), []byte("hello\n"), 0o644)
	disk := filepath.Join(t.TempDir(), "rw.ext4")
	os.WriteFile(disk, nil, 0o600)
	os.Truncate(disk, 16<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", src, disk).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 -d: %v: %s", err, out)
	}
	var buf bytes.Buffer
	st, err := rootfs.UpperLayerWith(context.Background(), disk, t.TempDir(), &buf, unpack.Limits{}, tool)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = string(b)
	}
	if files["d/f.txt"] != "hello\n" || st.Entries != 2 {
		t.Errorf("layer read by the confined tools: %d entries %q", st.Entries, files)
	}
}
