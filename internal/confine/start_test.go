package confine

import (
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestStartJail starts a program (a shell) confined as root would start a
// box's QEMU: as a uid of its own, in a read-only jail root that holds only
// the system directories bound into it and the files written there, in
// its own network namespace, in a cgroup, with no capability and
// no_new_privs, and with its listening socket as descriptor FDBase.
func TestStartJail(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a uid of its own, the jail's namespaces)")
	}
	uid := 0x6b000000 + rand.IntN(1<<20)
	dir := t.TempDir()
	sock := filepath.Join(dir, "prog.sock")
	var g *Cgroup
	if cg, err := NewCgroup("test-start-"+filepath.Base(dir), Limits{Pids: 32}); err == nil {
		g = cg
		defer g.Remove()
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	script := `cat /proc/self/status; echo "ROOT $(ls / | tr '\n' ' ')"; echo "HELLO $(cat /hello)"; ` +
		`echo "FD100 $(readlink /proc/self/fd/100)"; echo "NETNS $(readlink /proc/self/ns/net)"; ` +
		`echo "CGROUP $(cat /proc/self/cgroup | tr '\n' ' ')"; touch /x 2>/dev/null && echo WRITABLE; true`
	st, err := Start(Spec{
		Name: "test", Path: "/bin/sh", Args: []string{"-c", script}, Env: []string{"PATH=/usr/bin:/bin"},
		Root:   filepath.Join(dir, "jail"),
		Binds:  []string{"/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc/ld.so.cache"},
		Proc:   true,
		Listen: []string{sock},
		Write:  []WriteFile{{Path: "/hello", Data: []byte("from the caller"), Mode: 0o444}},
		UID:    uid, GID: uid,
		Stdout: w, Stderr: w, Cgroup: g,
	})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Go(); err != nil {
		st.Cmd.Process.Kill()
		st.Cmd.Wait()
		t.Fatal(err)
	}
	out, _ := io.ReadAll(r)
	if err := st.Cmd.Wait(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && !strings.Contains(k, " ") {
			got[k] = strings.TrimSpace(v)
		}
		if k, v, ok := strings.Cut(l, " "); ok && strings.ToUpper(k) == k {
			got[k] = strings.TrimSpace(v)
		}
	}
	if u := strings.Fields(got["Uid"] + " x")[0]; u != strconv.Itoa(uid) {
		t.Errorf("Uid %q, want %d\n%s", got["Uid"], uid, out)
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if got[k] != "0000000000000000" {
			t.Errorf("%s %s, want none", k, got[k])
		}
	}
	if got["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs %q", got["NoNewPrivs"])
	}
	for _, name := range strings.Fields(got["ROOT"]) {
		switch name {
		case "usr", "lib", "lib64", "bin", "sbin", "etc", "dev", "proc", "hello":
		default:
			t.Errorf("the jail root shows /%s (%s)", name, got["ROOT"])
		}
	}
	if got["HELLO"] != "from the caller" {
		t.Errorf("/hello holds %q", got["HELLO"])
	}
	if !strings.HasPrefix(got["FD100"], "socket:") {
		t.Errorf("descriptor %d is %q, want the listening socket", FDBase, got["FD100"])
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("listening socket %s: %v %v, want mode 0600", sock, fi, err)
	}
	if own, _ := os.Readlink("/proc/self/ns/net"); got["NETNS"] == "" || got["NETNS"] == own {
		t.Errorf("network namespace %q, the caller's is %q: want one of its own", got["NETNS"], own)
	}
	if g != nil && !strings.Contains(got["CGROUP"], "/airlock/test-start-") {
		t.Errorf("cgroups %q, want the test's", got["CGROUP"])
	}
	if _, ok := got["WRITABLE"]; ok || strings.Contains(string(out), "WRITABLE") {
		t.Error("the jail root is writable")
	}
}

// TestStartJailShowsShareOwner starts a program confined as root starts a
// box's QEMU with a host directory shared into its jail: the directory
// and its owner's files show their host owner in the jail (the program's
// user namespace maps only that owner to the program's uid), a file of
// another uid shows as the overflow uid and is reachable only through
// its "other" bits, what the program creates belongs on the host to the
// directory's owner, and the program holds no capability (#39 point 7).
// For a directory of root's, root's files show as root's, and the
// program, root in its namespace, still has no capability. Its
// supplementary group (as QEMU's kvm group) stays its own.
func TestStartJailShowsShareOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a uid of its own, idmapped mounts)")
	}
	for _, owner := range []int{1234, 0} {
		t.Run(strconv.Itoa(owner), func(t *testing.T) {
			uid := 0x6b000000 + rand.IntN(1<<20)
			dir := t.TempDir()
			vol := filepath.Join(dir, "vol")
			if err := os.Mkdir(vol, 0o755); err != nil {
				t.Fatal(err)
			}
			write := func(name string, mode os.FileMode, uid, gid int) {
				p := filepath.Join(vol, name)
				if err := os.WriteFile(p, []byte("secret\n"), mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(p, uid, gid); err != nil {
					t.Fatal(err)
				}
			}
			write("mine", 0o600, owner, owner+1)
			write("other", 0o600, 4321, 4321)
			write("shared", 0o644, 4321, 4321)
			if err := os.Chown(vol, owner, owner+1); err != nil {
				t.Fatal(err)
			}
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			script := `cd /shares/v; echo "STAT $(stat -c '%n=%u:%g' . mine other shared | tr '\n' ' ')"; ` +
				`echo "MINE $(cat mine)"; cat other >/dev/null 2>&1 && echo READ-OTHER; ` +
				`echo x >> shared 2>/dev/null && echo WROTE-SHARED; ` +
				`echo new > made && mkdir madedir && echo MADE; grep -E '^(Uid|Gid|Groups|Cap[A-Z][a-z]+|NoNewPrivs):' /proc/self/status`
			st, err := Start(Spec{
				Name: "test", Path: "/bin/sh", Args: []string{"-c", script}, Env: []string{"PATH=/usr/bin:/bin"},
				Root:   filepath.Join(dir, "jail"),
				Binds:  []string{"/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc/ld.so.cache"},
				Shares: []ShareMount{{Src: vol, Dst: "/shares/v"}},
				UID:    uid, GID: uid, Groups: []int{4444},
				Stdout: w, Stderr: w,
			})
			w.Close()
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Go(); err != nil {
				st.Cmd.Process.Kill()
				st.Cmd.Wait()
				t.Fatal(err)
			}
			out, _ := io.ReadAll(r)
			if err := st.Cmd.Wait(); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			got := map[string]string{}
			for _, l := range strings.Split(string(out), "\n") {
				if k, v, ok := strings.Cut(l, ":"); ok && !strings.Contains(k, " ") {
					got[k] = strings.Join(strings.Fields(v), " ")
				}
				if k, v, ok := strings.Cut(l, " "); ok && strings.ToUpper(k) == k {
					got[k] = strings.TrimSpace(v)
				}
			}
			o, g := strconv.Itoa(owner), strconv.Itoa(owner+1)
			if want := ".=" + o + ":" + g + " mine=" + o + ":" + g + " other=65534:65534 shared=65534:65534"; got["STAT"] != want {
				t.Errorf("in the jail: %q, want %q\n%s", got["STAT"], want, out)
			}
			if want := o + " " + o + " " + o + " " + o; got["Uid"] != want {
				t.Errorf("the program's Uid (in its namespace): %q, want %q", got["Uid"], want)
			}
			if want := g + " " + g + " " + g + " " + g; got["Gid"] != want || got["Groups"] != "4444" {
				t.Errorf("the program's Gid %q and Groups %q (in its namespace), want %q and 4444 (mapped to itself, as the kvm group)", got["Gid"], got["Groups"], want)
			}
			if got["MINE"] != "secret" || got["MADE"] == "" && !strings.Contains(string(out), "MADE") {
				t.Errorf("the owner's file read %q; made: %v\n%s", got["MINE"], strings.Contains(string(out), "MADE"), out)
			}
			if strings.Contains(string(out), "READ-OTHER") || strings.Contains(string(out), "WROTE-SHARED") {
				t.Errorf("the program got at another uid's files:\n%s", out)
			}
			for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
				if got[k] != "0000000000000000" {
					t.Errorf("%s %s, want none", k, got[k])
				}
			}
			if got["NoNewPrivs"] != "1" {
				t.Errorf("NoNewPrivs %q", got["NoNewPrivs"])
			}
			for _, name := range []string{"made", "madedir"} {
				fi, err := os.Stat(filepath.Join(vol, name))
				if err != nil {
					t.Fatal(err)
				}
				if s := fi.Sys().(*syscall.Stat_t); int(s.Uid) != owner || int(s.Gid) != owner+1 {
					t.Errorf("on the host, %s belongs to %d:%d, want %d:%d", name, s.Uid, s.Gid, owner, owner+1)
				}
			}
		})
	}
}
