//go:build linux

package agent

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// statusOf returns the fields of a /proc/.../status text.
func statusOf(s string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// runAs starts argv as uid:uid through startProcess and returns its stdout.
func runAs(t *testing.T, uid int, argv ...string) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	null, _ := os.Open(os.DevNull)
	defer null.Close()
	p, err := startProcess(uid, argv[0], argv, &os.ProcAttr{
		Files: []*os.File{null, w, os.Stderr},
		Sys:   &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}},
	})
	w.Close()
	if err != nil {
		t.Fatalf("start %q as %d: %v", argv, uid, err)
	}
	out, _ := io.ReadAll(r)
	p.Wait()
	return string(out)
}

// TestHostileGuestExecUserNoNewPrivs: a process started for a non-root
// exec user runs with no_new_privs and an empty bounding set, so a
// setuid-root binary in the image runs with the user's euid, not root's;
// the agent's own threads keep their privileges.
func TestHostileGuestExecUserNoNewPrivs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (to start a process as another uid, and to make a setuid-root file)")
	}
	st := statusOf(runAs(t, 65534, "/bin/cat", "/proc/self/status"))
	for k, want := range map[string]string{"NoNewPrivs": "1", "CapBnd": "0000000000000000", "CapInh": "0000000000000000",
		"CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapAmb": "0000000000000000"} {
		if st[k] != want {
			t.Errorf("exec as 65534: %s %q, want %q", k, st[k], want)
		}
	}
	// A setuid-root copy of id(1), where the file system honours setuid.
	dir, err := os.MkdirTemp("/var/tmp", "suid")
	if err != nil {
		dir = t.TempDir()
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	src, err := os.ReadFile("/usr/bin/id")
	if err != nil {
		t.Skip("no /usr/bin/id")
	}
	suid := filepath.Join(dir, "id")
	if err := os.WriteFile(suid, src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(suid, 0o4755); err != nil {
		t.Fatal(err)
	}
	var sf syscall.Statfs_t
	if syscall.Statfs(dir, &sf) == nil && sf.Flags&0x2 != 0 { // ST_NOSUID
		t.Skipf("%s is mounted nosuid", dir)
	}
	if got := strings.TrimSpace(runAs(t, 65534, suid, "-u")); got != "65534" {
		t.Errorf("setuid-root id run by exec user 65534 reports euid %q, want 65534", got)
	}
	if got := strings.TrimSpace(runAs(t, 0, suid, "-u")); got != "0" {
		t.Errorf("id as root: %q", got)
	}
	// No thread that runs Go code was left with no_new_privs: the one
	// that started the process ended (or, if it was the main thread, is
	// parked for good by the runtime).
	// A locked thread ends shortly after its goroutine: wait (with a
	// deadline) for the ones that set no_new_privs to be gone.
	var kept []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		kept = threadsWithNoNewPrivs()
		if len(kept) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, k := range kept {
		t.Errorf("thread of the agent with no_new_privs: %s", k)
	}
	for i := 0; i < 8; i++ {
		done := make(chan string)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b, _ := os.ReadFile("/proc/thread-self/status")
			done <- statusOf(string(b))["NoNewPrivs"]
		}()
		if v := <-done; v != "0" {
			t.Errorf("a goroutine of the agent runs with NoNewPrivs %q", v)
		}
	}
}

// A numeric uid that /etc/passwd does not list gets the gid of the same
// number, not root's group.
func TestExecUserNumericWithoutPasswdEntry(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nalice:x:1000:100::/home/alice:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\nusers:x:100:\nstaff:x:50:\n"), 0o644)
	for spec, want := range map[string][2]int{"4242": {4242, 4242}, "4242:50": {4242, 50}, "1000": {1000, 100}, "alice": {1000, 100}, "0": {0, 0}} {
		u, err := execUser(root, spec)
		if err != nil {
			t.Fatalf("execUser(%q): %v", spec, err)
		}
		if u.Uid != want[0] || u.Gid != want[1] {
			t.Errorf("execUser(%q) = %d:%d, want %d:%d", spec, u.Uid, u.Gid, want[0], want[1])
		}
	}
}

// threadsWithNoNewPrivs lists the threads of this process but its main
// one whose NoNewPrivs is set (task id: value).
func threadsWithNoNewPrivs() []string {
	var out []string
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		if task.Name() == strconv.Itoa(os.Getpid()) {
			continue // the main thread
		}
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue
		}
		if s := statusOf(string(b)); s["NoNewPrivs"] != "0" {
			out = append(out, task.Name()+": NoNewPrivs "+s["NoNewPrivs"])
		}
	}
	return out
}
