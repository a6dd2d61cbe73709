package confine

import (
	"bufio"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// setuidChildEnv makes the test binary a stand-in for a process of an old
// box: it changes its credentials without an exec, to real uid and gid N
// but effective (and saved) uid N+1, says so on stdout and waits for stdin
// to close. Its /proc/PID belongs to its effective uid; its real uid N
// still lets it signal the processes of uid N (kill(2) matches the
// sender's real or effective uid with the target's real or saved one).
const setuidChildEnv = "AIRLOCK_TEST_SETUID_CHILD"

func init() {
	v := os.Getenv(setuidChildEnv)
	if v == "" {
		return
	}
	uid, _ := strconv.Atoi(v)
	if err := syscall.Setgroups([]int{}); err != nil {
		os.Exit(3)
	}
	if syscall.Setresgid(uid, uid, uid) != nil || syscall.Setresuid(uid, uid+1, uid+1) != nil {
		os.Exit(4)
	}
	os.Stdout.WriteString("ok\n")
	b := make([]byte, 1)
	os.Stdin.Read(b)
	os.Exit(0)
}

// TestHostileGuestBoxUIDInUse: a uid is not handed to a new box while a
// process of an old box still holds it, as its real, effective, saved or
// file system uid or as a gid (box uids and gids are the same numbers),
// whoever /proc/PID belongs to.
func TestHostileGuestBoxUIDInUse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (to run a process as another uid)")
	}
	uid := 0x6e000000 + rand.IntN(1<<20)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = []string{setuidChildEnv + "=" + strconv.Itoa(uid)}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	if l, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || l != "ok\n" {
		t.Fatalf("stand-in process: %q %v", l, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+strconv.Itoa(cmd.Process.Pid), &st); err != nil || int(st.Uid) == uid {
		t.Fatalf("the stand-in's /proc/PID belongs to %d (%v), want another uid than %d, else this test shows nothing", st.Uid, err, uid)
	}
	if !procUIDs()[uid] {
		t.Errorf("procUIDs misses uid %d of process %d", uid, cmd.Process.Pid)
	}
	got, err := AllocUID(UIDRange{Start: uid, Count: 1})
	if err == nil {
		os.Remove(filepath.Join(uidClaimDir, strconv.Itoa(got)))
		t.Fatalf("AllocUID handed out uid %d, which process %d runs as", got, cmd.Process.Pid)
	}
}

func BenchmarkProcUIDs(b *testing.B) {
	for i := 0; i < b.N; i++ {
		procUIDs()
	}
}
