package netstack

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// dropChildEnv makes the test binary call dropPrivileges(N, N, raw) (the
// value is "N raw" or "N noraw") and print its /proc/self/status.
const dropChildEnv = "AIRLOCK_TEST_DROP_CHILD"

func init() {
	v := os.Getenv(dropChildEnv)
	if v == "" {
		return
	}
	f := strings.Fields(v)
	uid, _ := strconv.Atoi(f[0])
	if err := dropPrivileges(uid, uid, f[1] == "raw"); err != nil {
		os.Stderr.WriteString(err.Error())
		if errors.Is(err, ErrCgoBuild) {
			os.Exit(5)
		}
		os.Exit(3)
	}
	b, _ := os.ReadFile("/proc/self/status")
	os.Stdout.Write(b)
	os.Exit(0)
}

// TestHostileGuestHelperBoundingSet: the confined network helper keeps an
// empty bounding set, and CAP_NET_RAW only where the host allows its gid
// no unprivileged ICMP socket.
func TestHostileGuestHelperBoundingSet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (to change uid)")
	}
	uid := 0x6c000000 + os.Getpid()
	for _, c := range []struct {
		mode string
		eff  string
	}{{"noraw", "0000000000000000"}, {"raw", "0000000000002000"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = []string{dropChildEnv + "=" + strconv.Itoa(uid) + " " + c.mode}
		out, err := cmd.Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 5 {
			t.Skip("a cgo build cannot change all threads' credentials: CGO_ENABLED=0 go test")
		}
		if err != nil {
			t.Fatalf("%s: %v %s", c.mode, err, ee.Stderr)
		}
		st := map[string]string{}
		for _, l := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				st[k] = strings.TrimSpace(v)
			}
		}
		want := map[string]string{"CapBnd": "0000000000000000", "CapInh": "0000000000000000", "CapAmb": "0000000000000000",
			"CapEff": c.eff, "CapPrm": c.eff, "NoNewPrivs": "1"}
		for k, v := range want {
			if st[k] != v {
				t.Errorf("%s: %s %q, want %q", c.mode, k, st[k], v)
			}
		}
		if u := strings.Fields(st["Uid"] + " x")[0]; u != strconv.Itoa(uid) {
			t.Errorf("%s: Uid %q", c.mode, st["Uid"])
		}
	}
}

func TestPingAllowed(t *testing.T) {
	for _, c := range []struct {
		sysctl string
		gid    int
		want   bool
	}{
		{"1\t0\n", 0, false}, {"1\t0\n", 1, false}, {"0\t2147483647\n", 1879048200, true},
		{"100 200", 99, false}, {"100 200", 100, true}, {"100 200", 200, true}, {"100 200", 201, false},
		{"", 5, false}, {"x y", 5, false},
	} {
		if got := pingAllowed(c.sysctl, c.gid); got != c.want {
			t.Errorf("pingAllowed(%q, %d) = %v, want %v", c.sysctl, c.gid, got, c.want)
		}
	}
}
