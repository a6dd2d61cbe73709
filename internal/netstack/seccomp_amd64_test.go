package netstack

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const seccompChildEnv = "AIRLOCK_TEST_SECCOMP_CHILD"

// TestSeccompFilter runs this test binary again as a child that installs
// the helper's filter (installSeccomp, as airlock-net does) and then tries
// what code that took the helper over would: open a file, make a unix
// socket, exec a program. The parent checks the kernel's view of the
// child (Seccomp: 2 in /proc/PID/status) and that the exec killed it. The
// child installs it as it is (root here, as a confined helper after
// dropPrivileges keeps no_new_privs) and, when root, also after becoming
// uid 65534 (an unprivileged airlock's helper: no capability, only
// no_new_privs).
func TestSeccompFilter(t *testing.T) {
	if mode := os.Getenv(seccompChildEnv); mode != "" {
		seccompChild(mode)
		return
	}
	modes := []string{"as-is"}
	if os.Geteuid() == 0 {
		modes = append(modes, "unprivileged")
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) { testSeccompChild(t, mode) })
	}
}

func testSeccompChild(t *testing.T, mode string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestSeccompFilter$", "-test.count=1")
	cmd.Env = append(os.Environ(), seccompChildEnv+"="+mode)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	got := map[string]string{}
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		got[k] = v
		if k == "ready" {
			break
		}
	}
	if got["install"] != "ok" {
		t.Fatalf("child: installSeccomp: %q (child said %v)", got["install"], got)
	}
	if mode == "unprivileged" && got["uid"] != "65534" {
		t.Fatalf("child runs as uid %q, want 65534", got["uid"])
	}
	if d := got["logdir"]; d != "" {
		defer os.RemoveAll(d)
		cur, _ := os.ReadFile(d + "/log")
		old, _ := os.ReadFile(d + "/log.1")
		if !strings.HasPrefix(string(cur), "second") || !strings.HasPrefix(string(old), "first") {
			t.Errorf("deny log after a rotation under the filter: log %q, log.1 %q; want the second line, the first", cur, old)
		}
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), "\nSeccomp:\t2\n") || !strings.Contains(string(st), "\nNoNewPrivs:\t1\n") {
		t.Errorf("child's /proc status has no Seccomp: 2 and NoNewPrivs: 1:\n%s", st)
	}
	for k, want := range map[string]string{
		"open":      "operation not permitted",
		"unix":      "operation not permitted",
		"netlink":   "operation not permitted",
		"inet":      "ok",
		"inet6":     "ok",
		"setuid":    "operation not permitted",
		"threads":   "ok",
		"pipewrite": "ok",
		"logwrite":  "ok",
	} {
		if got[k] != want {
			t.Errorf("child: %s: %q, want %q", k, got[k], want)
		}
	}
	stdin.Write([]byte("exec\n"))
	for sc.Scan() {
		t.Logf("child after exec: %s", sc.Text())
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child exited with %v after trying execve; want killed by SIGSYS", err)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGSYS {
		t.Errorf("child ended with %v after trying execve; want killed by SIGSYS (seccomp)", err)
	}
}

// seccompChild is the child of TestSeccompFilter; it reports on stdout.
func seccompChild(mode string) {
	res := func(err error) string {
		if err != nil {
			return err.Error()
		}
		return "ok"
	}
	sock := func(domain, typ int) error {
		fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
	if mode == "unprivileged" {
		// syscall's Set* change every thread (AllThreadsSyscall).
		if err := syscall.Setgroups(nil); err == nil {
			if err = syscall.Setresgid(65534, 65534, 65534); err == nil {
				err = syscall.Setresuid(65534, 65534, 65534)
			}
		}
		fmt.Printf("uid=%d\n", os.Geteuid())
	}
	// The deny log, opened before (as airlock-net does), rotates under
	// the filter.
	dir, err := os.MkdirTemp("", "seccomp-log")
	if err != nil {
		fmt.Printf("install=%v\nready=1\n", err)
		os.Exit(1)
	}
	fmt.Printf("logdir=%s\n", dir)
	lf, err := OpenLog(dir+"/log", 64)
	if err != nil {
		fmt.Printf("install=%v\nready=1\n", err)
		os.Exit(1)
	}
	if err := installSeccomp(); err != nil {
		fmt.Printf("install=%v\nready=1\n", err)
		os.Exit(1)
	}
	fmt.Println("install=ok")
	for _, line := range []string{"first line of forty bytes, rotated.....\n", "second line, kept after the rotation..\n"} {
		if _, err = lf.Write([]byte(line)); err != nil {
			break
		}
	}
	fmt.Printf("logwrite=%s\n", res(err))
	_, err = os.Open("/etc/hostname")
	fmt.Printf("open=%s\n", res(errors.Unwrap(err)))
	fmt.Printf("unix=%s\n", res(sock(unix.AF_UNIX, unix.SOCK_STREAM)))
	fmt.Printf("netlink=%s\n", res(sock(unix.AF_NETLINK, unix.SOCK_RAW)))
	fmt.Printf("inet=%s\n", res(sock(unix.AF_INET, unix.SOCK_STREAM)))
	fmt.Printf("inet6=%s\n", res(sock(unix.AF_INET6, unix.SOCK_DGRAM)))
	_, _, e := syscall.RawSyscall(syscall.SYS_SETUID, 0, 0, 0)
	fmt.Printf("setuid=%s\n", res(errnoErr(e)))
	// New threads under the filter: each goroutine locked to its thread
	// makes the runtime start another (pthread_create in a cgo binary:
	// clone3, then rseq in the new thread).
	locked := make(chan struct{})
	for range 8 {
		go func() {
			runtime.LockOSThread()
			locked <- struct{}{}
			select {}
		}()
	}
	for range 8 {
		<-locked
	}
	fmt.Println("threads=ok")
	_, err = os.Stdout.Write(nil)
	fmt.Printf("pipewrite=%s\nready=1\n", res(err))
	bufio.NewReader(os.Stdin).ReadString('\n')
	err = syscall.Exec("/bin/true", []string{"true"}, nil)
	fmt.Printf("exec=%v\n", err)
	os.Exit(0)
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
