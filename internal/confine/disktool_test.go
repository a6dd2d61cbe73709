package confine

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"

	"github.com/airlock-run/airlock/internal/defaults"
)

// TestDiskToolUnconfinedRunsAsCallerWithTheAllowlistedEnv: unconfined,
// the tool runs as it is, with the allowlisted environment only.
func TestDiskToolUnconfinedRunsAsCallerWithTheAllowlistedEnv(t *testing.T) {
	t.Setenv("AIRLOCK_TOKEN", "secret")
	tool, err := DiskTool(true, "")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/true")
	if err := tool(cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.Path != "/bin/true" || cmd.SysProcAttr != nil || !reflect.DeepEqual(cmd.Env, defaults.ChildEnv()) {
		t.Errorf("cmd %s %v env %v: want it as it was, with defaults.ChildEnv", cmd.Path, cmd.SysProcAttr, cmd.Env)
	}
}

// TestChownDirHandsOverWithoutFollowingLinks: the tools' directory and
// its entries go to the tool's uid; a symlink there is changed itself,
// never what it points to.
func TestChownDirHandsOverWithoutFollowingLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	dir, outside := t.TempDir(), filepath.Join(t.TempDir(), "host-file")
	os.WriteFile(outside, nil, 0o600)
	os.WriteFile(filepath.Join(dir, "disk"), nil, 0o600)
	os.Symlink(outside, filepath.Join(dir, "link"))
	const uid = 54321
	if err := chownDir(dir, uid); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "disk"), filepath.Join(dir, "link")} {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || st.Uid != uid || st.Gid != uid {
			t.Errorf("%s: owner %d:%d (%v), want %d", p, st.Uid, st.Gid, err, uid)
		}
	}
	var st syscall.Stat_t
	if syscall.Stat(outside, &st); st.Uid != 0 {
		t.Errorf("the link's target was chowned to %d", st.Uid)
	}
}
