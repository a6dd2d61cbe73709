package airlock_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/transport"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// procStatus returns the fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// asUID runs fn on an OS thread whose effective uid and gid are uid (and
// no supplementary groups, no capabilities); the thread is thrown away
// afterwards. Raw set*id system calls change only the calling thread.
func asUID(t *testing.T, uid int, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			t.Errorf("setgroups: %v", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			t.Errorf("setresgid: %v", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			t.Errorf("setresuid: %v", e)
			return
		}
		fn()
	}()
	<-done
}

func boxDir(r *airlock.Runtime, b *airlock.Box) string {
	return filepath.Join(r.Home(), "boxes", b.ID())
}

// TestConfinedQEMU checks a root-started box's QEMU: its own non-root uid,
// seccomp and no_new_privs, its own network namespace and cgroup, a jail
// with no host files, no monitor command that spawns processes, and no
// way in for another uid (another box's QEMU, or nobody).
func TestConfinedQEMU(t *testing.T) {
	vmtest.Require(t)
	if os.Geteuid() != 0 {
		t.Skip("confinement with a uid per box needs root (TestLaunchUnprivileged covers the rest)")
	}
	if os.Getenv("AIRLOCK_CONFINE") == "off" {
		t.Skip("AIRLOCK_CONFINE=off")
	}
	r, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}, ConsoleMaxBytes: 65536})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ctx := context.Background()
	a, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove(context.Background(), a.ID(), true) })
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })
	ia, _ := a.Info(ctx)
	ib, _ := b.Info(ctx)
	uidA, _ := strconv.Atoi(strings.Fields(procStatus(t, ia.PID)["Uid"] + " 0")[0])

	t.Run("status", func(t *testing.T) {
		for _, pid := range []int{ia.PID, ib.PID} {
			st := procStatus(t, pid)
			uids := strings.Fields(st["Uid"])
			if len(uids) != 4 || uids[0] == "0" || uids[0] != uids[1] || uids[0] != uids[2] || uids[0] != uids[3] {
				t.Errorf("QEMU %d Uid: %q, want one non-root uid", pid, st["Uid"])
			}
			if st["Seccomp"] != "2" || st["NoNewPrivs"] != "1" {
				t.Errorf("QEMU %d: Seccomp %q NoNewPrivs %q, want 2 and 1", pid, st["Seccomp"], st["NoNewPrivs"])
			}
			for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
				if st[k] != "0000000000000000" {
					t.Errorf("QEMU %d %s: %s, want none", pid, k, st[k])
				}
			}
		}
		if procStatus(t, ia.PID)["Uid"] == procStatus(t, ib.PID)["Uid"] {
			t.Errorf("two boxes share QEMU uid %s", procStatus(t, ia.PID)["Uid"])
		}
		// The console drainer gave up root for the box's uid.
		drainer := 0
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			cmd, _ := os.ReadFile("/proc/" + p.Name() + "/cmdline")
			if strings.HasPrefix(string(cmd), "airlock-console-drain\x00"+a.ConsoleLog()+"\x00") {
				drainer, _ = strconv.Atoi(p.Name())
			}
		}
		if drainer == 0 {
			t.Error("no console drainer for box A")
		} else if du, qu := procStatus(t, drainer)["Uid"], procStatus(t, ia.PID)["Uid"]; du != qu {
			t.Errorf("console drainer runs as %q, box A's QEMU as %q", du, qu)
		}
		self, _ := os.Readlink("/proc/self/ns/net")
		netns, _ := os.Readlink("/proc/" + strconv.Itoa(ia.PID) + "/ns/net")
		if netns == "" || netns == self {
			t.Errorf("QEMU of a box without network is in the host network namespace (%s)", netns)
		}
		// The jail: system directories, the kernel, device nodes; nothing
		// of the host's home, temp dir or box directories.
		ents, err := os.ReadDir("/proc/" + strconv.Itoa(ia.PID) + "/root")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		for _, bad := range []string{"tmp", "root", "home", "proc", "work", "var", "run"} {
			for _, n := range names {
				if n == bad {
					t.Errorf("jail root shows /%s: %v", bad, names)
				}
			}
		}
	})

	t.Run("cgroup", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(boxDir(r, a), "cgroup"))
		if err != nil {
			t.Skipf("no cgroup on this host: %v", err)
		}
		for _, d := range strings.Fields(string(b)) {
			procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if !strings.Contains(" "+strings.Join(strings.Fields(string(procs)), " ")+" ", " "+strconv.Itoa(ia.PID)+" ") {
				t.Errorf("QEMU %d not in %s (%q)", ia.PID, d, procs)
			}
			for _, f := range []string{"memory.limit_in_bytes", "memory.max"} {
				if v, err := os.ReadFile(filepath.Join(d, f)); err == nil {
					n, _ := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
					if n < 256<<20 || n > 2<<30 {
						t.Errorf("%s/%s = %d, want guest RAM (256 MiB) + overhead", d, f, n)
					}
				}
			}
			if v, err := os.ReadFile(filepath.Join(d, "pids.max")); err == nil && strings.TrimSpace(string(v)) == "max" {
				t.Errorf("%s: no pids limit", d)
			}
		}
	})

	t.Run("monitor cannot spawn", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "spawned")
		os.Chmod(filepath.Dir(marker), 0o777)
		resp := qmp(t, filepath.Join(boxDir(r, a), "qmp.sock"),
			map[string]any{"execute": "human-monitor-command", "arguments": map[string]any{"command-line": `migrate "exec:touch ` + marker + `"`}},
			map[string]any{"execute": "migrate", "arguments": map[string]any{"uri": "exec:touch " + marker}})
		if !strings.Contains(resp[0], "does not support live migration") || !strings.Contains(resp[1], `"error"`) {
			t.Errorf("migrate exec: was not refused: %q", resp)
		}
		time.Sleep(200 * time.Millisecond)
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("migrate exec: ran its command")
		}
		if res := exec(t, a, airlock.ExecOptions{}, "true"); res.ExitCode != 0 {
			t.Fatalf("box no longer answers after the refused migrate: %+v", res)
		}
	})

	t.Run("other uids cannot reach a box", func(t *testing.T) {
		dirB := boxDir(r, b)
		for _, who := range []struct {
			name string
			uid  int
		}{{"box A's QEMU uid", uidA}, {"nobody", 65534}} {
			asUID(t, who.uid, func() {
				for _, f := range []string{"agent-0.sock", "qmp.sock"} {
					c, err := net.Dial("unix", filepath.Join(dirB, f))
					if err == nil {
						c.Close()
						t.Errorf("%s connected to box B's %s", who.name, f)
					}
				}
				for _, f := range []string{"rw.ext4", "secret", "console.log"} {
					if fd, err := unix.Open(filepath.Join(dirB, f), unix.O_RDONLY, 0); err == nil {
						unix.Close(fd)
						t.Errorf("%s opened box B's %s", who.name, f)
					}
				}
				if err := unix.Kill(ib.PID, 0); !errors.Is(err, unix.EPERM) {
					t.Errorf("%s may signal box B's QEMU: %v", who.name, err)
				}
			})
		}
	})

	t.Run("agent refuses a wrong secret", func(t *testing.T) {
		// Even with the socket in reach (here: as root), no call is served
		// without the box's secret.
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		// Take port 3 so that the runtime's own connection is not disturbed.
		_, err := client.DialAuth(dctx, []byte("not-the-secret"), func(ctx context.Context) (net.Conn, error) {
			return net.Dial("unix", filepath.Join(boxDir(r, a), "agent-3.sock"))
		})
		if !errors.Is(err, transport.ErrDenied) {
			t.Fatalf("dial with a wrong secret: %v, want ErrDenied", err)
		}
		if res := exec(t, a, airlock.ExecOptions{}, "true"); res.ExitCode != 0 {
			t.Fatalf("box no longer answers: %+v", res)
		}
	})

	t.Run("restore rotates the secret", func(t *testing.T) {
		// The snapshot's memory holds box A's secret; the restored box gets
		// a fresh one, confined like any other, and refuses A's.
		if _, err := a.Snapshot(ctx, "rotate"); err != nil {
			t.Fatal(err)
		}
		c, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: "rotate"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Remove(context.Background(), c.ID(), true) })
		if res := exec(t, c, airlock.ExecOptions{}, "true"); res.ExitCode != 0 {
			t.Fatalf("restored box: %+v", res)
		}
		old, _ := os.ReadFile(filepath.Join(boxDir(r, a), "secret"))
		now, _ := os.ReadFile(filepath.Join(boxDir(r, c), "secret"))
		if len(old) == 0 || string(old) == string(now) {
			t.Fatalf("restored box's secret %q, snapshot's %q: want a fresh one", now, old)
		}
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err = client.DialAuth(dctx, old, func(ctx context.Context) (net.Conn, error) {
			return net.Dial("unix", filepath.Join(boxDir(r, c), "agent-3.sock"))
		})
		if !errors.Is(err, transport.ErrDenied) {
			t.Fatalf("the snapshot's secret on the restored box: %v, want ErrDenied", err)
		}
		ic, _ := c.Info(ctx)
		st := procStatus(t, ic.PID)
		if u := strings.Fields(st["Uid"] + " 0")[0]; u == "0" || u == strconv.Itoa(uidA) || st["Seccomp"] != "2" || st["NoNewPrivs"] != "1" {
			t.Errorf("restored QEMU: Uid %q (box A: %d), Seccomp %q, NoNewPrivs %q", st["Uid"], uidA, st["Seccomp"], st["NoNewPrivs"])
		}
	})

	t.Run("console flood stays under its cap", func(t *testing.T) {
		// Box A was started with ConsoleMaxBytes 64 KiB; ~300 KB of
		// console output with terminal escapes leave a log under the cap
		// that ends with the last line, escaped when shown.
		res := exec(t, a, airlock.ExecOptions{}, "sh", "-c",
			`i=0; while [ $i -lt 2000 ]; do printf 'flood %d \033[2J%0128d\n' $i 0; i=$((i+1)); done > /dev/console; echo flood-end > /dev/console`)
		if res.ExitCode != 0 {
			t.Fatalf("flood: %+v", res)
		}
		var log []byte
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			log, _ = os.ReadFile(a.ConsoleLog())
			if strings.Contains(string(log), "flood-end") {
				break
			}
		}
		if len(log) > 64<<10 || !strings.Contains(string(log), "flood 1999 ") || !strings.Contains(string(log), "flood-end") {
			t.Fatalf("console log after a flood: %d bytes (cap 65536), ends %q", len(log), log[max(0, len(log)-100):])
		}
		if shown := airlock.EscapeConsole(string(log)); !strings.Contains(shown, `\x1b[2J`) || strings.ContainsRune(shown, 0x1b) {
			t.Fatal("escape sequences not escaped")
		}
	})

	t.Run("stop removes the cgroup", func(t *testing.T) {
		raw, err := os.ReadFile(filepath.Join(boxDir(r, b), "cgroup"))
		if err != nil {
			t.Skip("no cgroup on this host")
		}
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		for _, d := range strings.Fields(string(raw)) {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("cgroup %s still there after Stop", d)
			}
		}
	})
}

// qmp sends cmds to a QMP socket and returns each response line.
func qmp(t *testing.T, sock string, cmds ...map[string]any) []string {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	rd := bufio.NewReader(c)
	read := func() string {
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("qmp: %v", err)
			}
			if !strings.Contains(l, `"event"`) {
				return l
			}
		}
	}
	read() // greeting
	send := func(m map[string]any) string {
		b, _ := json.Marshal(m)
		c.Write(append(b, '\n'))
		return read()
	}
	send(map[string]any{"execute": "qmp_capabilities"})
	var out []string
	for _, m := range cmds {
		out = append(out, send(m))
	}
	return out
}

// TestConfinedNetworkAndVolumes checks, on one box started by root with a
// network and 9p volumes: its QEMU is in a network namespace of its own
// (the network helper's socket is a descriptor), the helper runs as a uid
// of its own with no_new_privs, an empty bounding set and at most
// CAP_NET_RAW (none where ping_group_range covers it), in its own cgroup;
// the volumes are in the jail, what the box writes on the host belongs to
// the directory's owner, and a read-only volume stays read-only.
func TestConfinedNetworkAndVolumes(t *testing.T) {
	vmtest.Require(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if os.Getenv("AIRLOCK_CONFINE") == "off" {
		t.Skip("AIRLOCK_CONFINE=off")
	}
	r := openRuntime(t, "")
	ctx := context.Background()
	rw, ro := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(ro, "in.txt"), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := r.Create(ctx, airlock.BoxOptions{Volumes: []airlock.Volume{{Source: rw, Target: "/rw"}, {Source: ro, Target: "/ro", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	info, _ := b.Info(ctx)
	q := procStatus(t, info.PID)
	self, _ := os.Readlink("/proc/self/ns/net")
	if ns, _ := os.Readlink("/proc/" + strconv.Itoa(info.PID) + "/ns/net"); ns == "" || ns == self {
		t.Errorf("QEMU of a box with network is in the host network namespace (%s)", ns)
	}
	raw, err := os.ReadFile(filepath.Join(boxDir(r, b), "net.pid"))
	if err != nil {
		t.Fatal(err)
	}
	hp, _ := strconv.Atoi(strings.Fields(string(raw))[0])
	h := procStatus(t, hp)
	hu := strings.Fields(h["Uid"] + " 0")[0]
	// CAP_NET_RAW only where the host allows the helper's gid no
	// unprivileged ICMP socket; never in its bounding set.
	wantEff := "0000000000002000"
	if pr, err := os.ReadFile("/proc/sys/net/ipv4/ping_group_range"); err == nil {
		f := strings.Fields(string(pr))
		lo, _ := strconv.Atoi(f[0])
		hi, _ := strconv.Atoi(f[1])
		if g, _ := strconv.Atoi(strings.Fields(h["Gid"] + " -1")[0]); g >= lo && g <= hi {
			wantEff = "0000000000000000"
		}
	}
	if hu == "0" || hu == strings.Fields(q["Uid"] + " 0")[0] || h["NoNewPrivs"] != "1" || h["CapEff"] != wantEff || h["CapBnd"] != "0000000000000000" {
		t.Errorf("network helper: Uid %q (QEMU %q), NoNewPrivs %q, CapEff %q, CapBnd %q; want its own non-root uid, 1, %s, none", h["Uid"], q["Uid"], h["NoNewPrivs"], h["CapEff"], h["CapBnd"], wantEff)
	}
	if runtime.GOARCH == "amd64" && h["Seccomp"] != "2" {
		t.Errorf("network helper: Seccomp %q, want 2 (its seccomp allowlist)", h["Seccomp"])
	}
	if root, _ := os.Readlink("/proc/" + strconv.Itoa(hp) + "/root"); root != filepath.Join(boxDir(r, b), "net-root") {
		t.Errorf("network helper's root is %q, want its empty net-root", root)
	}
	if cg, err := os.ReadFile(filepath.Join(boxDir(r, b), "net.cgroup")); err == nil {
		for _, d := range strings.Fields(string(cg)) {
			procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if !strings.Contains(" "+strings.Join(strings.Fields(string(procs)), " ")+" ", " "+strconv.Itoa(hp)+" ") {
				t.Errorf("network helper %d not in %s", hp, d)
			}
		}
	} else if _, err := os.Stat(filepath.Join(boxDir(r, b), "cgroup")); err == nil {
		t.Error("QEMU has a cgroup and the network helper none")
	}
	res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", "cat /ro/in.txt && echo boxed > /rw/out.txt && mkdir /rw/d && ! touch /ro/x 2>/dev/null")
	if res.ExitCode != 0 || string(res.Stdout) != "host" {
		t.Fatalf("volumes in the jail: %+v", res)
	}
	for _, p := range []string{filepath.Join(rw, "out.txt"), filepath.Join(rw, "d")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s written by the box belongs to %d:%d on the host, want the directory's owner 0:0", p, st.Uid, st.Gid)
		}
	}
	if _, err := os.Stat(filepath.Join(ro, "x")); err == nil {
		t.Error("the box wrote into its read-only volume")
	}
}

// TestHostileGuestNoHostSecretInHelpers: code that takes over a box's
// QEMU, network helper or virtiofsd reads its own /proc/self/environ; none
// of them holds the caller's secrets (AIRLOCK_TOKEN, API keys). As root,
// QEMU also holds no capability, not even in its bounding set, and runs
// with no_new_privs.
func TestHostileGuestNoHostSecretInHelpers(t *testing.T) {
	vmtest.Require(t)
	t.Setenv("AIRLOCK_TOKEN", "host-token-x")
	t.Setenv("OPENAI_API_KEY", "sk-host-key-y")
	opts := airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}}
	if os.Geteuid() == 0 {
		opts.VolumeTransport = "virtiofs" // the C virtiofsd needs root
	}
	r, err := airlock.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ctx := context.Background()
	vol := t.TempDir()
	b, err := r.Create(ctx, airlock.BoxOptions{Volumes: []airlock.Volume{{Source: vol, Target: "/v"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	info, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]int{"QEMU": info.PID}
	if raw, err := os.ReadFile(filepath.Join(boxDir(r, b), "net.pid")); err == nil {
		pids["network helper"], _ = strconv.Atoi(strings.Fields(string(raw))[0])
	} else {
		t.Errorf("no network helper: %v", err)
	}
	for i, pid := range virtiofsds(vol) {
		pids["virtiofsd "+strconv.Itoa(i)] = pid
	}
	if opts.VolumeTransport == "virtiofs" && len(pids) < 3 {
		t.Errorf("no virtiofsd found for %s", vol)
	}
	for name, pid := range pids {
		env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			t.Errorf("%s %d: %v", name, pid, err)
			continue
		}
		for _, e := range strings.Split(string(env), "\x00") {
			if strings.Contains(e, "host-token-x") || strings.Contains(e, "sk-host-key-y") || strings.HasPrefix(e, "AIRLOCK_TOKEN=") || strings.HasPrefix(e, "OPENAI_API_KEY=") {
				t.Errorf("%s %d has %q in its environment", name, pid, e)
			}
		}
	}
	if os.Geteuid() != 0 || os.Getenv("AIRLOCK_CONFINE") == "off" {
		return
	}
	st := procStatus(t, info.PID)
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if st[k] != "0000000000000000" {
			t.Errorf("QEMU %d %s: %s, want 0000000000000000", info.PID, k, st[k])
		}
	}
	if st["NoNewPrivs"] != "1" {
		t.Errorf("QEMU %d NoNewPrivs %q, want 1", info.PID, st["NoNewPrivs"])
	}
}

// TestHostileGuestExecUserStaysUser: `exec -u 1000` of a setuid-root
// binary in the image runs with euid 1000, not box root, and the exec runs
// with no_new_privs and an empty bounding set; a numeric uid without a
// passwd entry gets its own gid, not 0.
func TestHostileGuestExecUserStaysUser(t *testing.T) {
	vmtest.Require(t)
	r := openRuntime(t, "")
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Network: airlock.NetworkDisabled})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	// A setuid-root copy of a real (not busybox) id or python3, where the
	// image has one.
	suid := sh(t, b, `mkdir -p /opt/suid && chmod 755 /opt/suid
for p in /usr/bin/id /bin/id /usr/bin/python3; do
  if [ -f "$p" ] && ! [ -L "$p" ] && ! "$p" --help 2>&1 | grep -qi busybox; then
    cp "$p" /opt/suid/x && chmod 4755 /opt/suid/x && echo "$p" && break
  fi
done`)
	res := exec(t, b, airlock.ExecOptions{User: "1000"}, "cat", "/proc/self/status")
	st := map[string]string{}
	for _, l := range strings.Split(string(res.Stdout), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	if st["NoNewPrivs"] != "1" || st["CapBnd"] != "0000000000000000" || st["CapEff"] != "0000000000000000" {
		t.Errorf("exec -u 1000: NoNewPrivs %q CapBnd %q CapEff %q; want 1 and none", st["NoNewPrivs"], st["CapBnd"], st["CapEff"])
	}
	if g := strings.Fields(st["Gid"] + " x")[0]; g != "1000" {
		t.Errorf("exec -u 1000 (no passwd entry) runs with gid %q, want 1000", st["Gid"])
	}
	t.Logf("setuid copy of %q", strings.TrimSpace(suid))
	switch strings.TrimSpace(suid) {
	case "":
		t.Log("the image has no id or python3 that is not busybox: the setuid check is skipped")
	case "/usr/bin/python3":
		res = exec(t, b, airlock.ExecOptions{User: "1000"}, "/opt/suid/x", "-c", "import os; print(os.geteuid())")
	default:
		res = exec(t, b, airlock.ExecOptions{User: "1000"}, "/opt/suid/x", "-u")
	}
	if suid != "" && strings.TrimSpace(string(res.Stdout)) != "1000" {
		t.Errorf("a setuid-root %s run by exec -u 1000 has euid %q (stderr %q), want 1000", strings.TrimSpace(suid), res.Stdout, res.Stderr)
	}
	// Root stays root.
	if res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", "grep NoNewPrivs /proc/self/status"); !strings.Contains(string(res.Stdout), "0") {
		t.Errorf("exec as root: %q", res.Stdout)
	}
}
