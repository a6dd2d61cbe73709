package jailstage

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// confineChildEnv makes the test binary call Confine(N, N, nil) and exec
// cat /proc/self/status: what a QEMU the stage execs would show.
const confineChildEnv = "AIRLOCK_TEST_CONFINE_CHILD"

func init() {
	v := os.Getenv(confineChildEnv)
	if v == "" {
		return
	}
	uid, _ := strconv.Atoi(v)
	runtime.LockOSThread()
	if err := Confine(uid, uid, nil); err != nil {
		os.Stderr.WriteString("confine: " + err.Error() + "\n")
		os.Exit(3)
	}
	err := execve("/bin/cat", []string{"cat", "/proc/self/status"}, []string{})
	os.Stderr.WriteString("exec: " + err.Error() + "\n")
	os.Exit(4)
}

// TestHostileGuestStageDropsAllCapabilities: what the launcher stage
// execs as the box's uid (QEMU) has no capability in any set, the bounding
// set included, and no_new_privs; a drop that fails is an error, not
// silence.
func TestHostileGuestStageDropsAllCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (to change uid)")
	}
	for _, uid := range []int{0, 0x6d000000 + os.Getpid()} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = []string{confineChildEnv + "=" + strconv.Itoa(uid)}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("uid %d: %v: %s", uid, err, err.(*exec.ExitError).Stderr)
		}
		st := map[string]string{}
		for _, l := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				st[k] = strings.TrimSpace(v)
			}
		}
		for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if st[k] != "0000000000000000" {
				t.Errorf("uid %d: %s %s, want 0000000000000000", uid, k, st[k])
			}
		}
		if st["NoNewPrivs"] != "1" || strings.Fields(st["Uid"] + " x")[0] != strconv.Itoa(uid) {
			t.Errorf("uid %d: NoNewPrivs %q Uid %q", uid, st["NoNewPrivs"], st["Uid"])
		}
	}
}

func execve(path string, argv, env []string) error { return unix.Exec(path, argv, env) }
