package confine

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// setIDProbeEnv makes the test binary a stand-in for a QEMU taken over:
// in the directory the variable names it tries chmod 04755 and 02755 of
// "f", open(O_CREAT, 04755) and openat(O_CREAT, 02755) of new files, a
// file capability on "g", then
// chmod 0755 of "g" and an ordinary create, printing "name=errno" lines.
const setIDProbeEnv = "AIRLOCK_TEST_SETID_PROBE"

func init() {
	dir := os.Getenv(setIDProbeEnv)
	if dir == "" {
		return
	}
	try := func(name string, err error) {
		e, _ := err.(syscall.Errno)
		fmt.Printf("%s=%d\n", name, int(e))
	}
	closed := func(fd int, err error) error {
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
	try("chmod-4755", unix.Chmod(dir+"/f", 0o4755))
	try("chmod-2755", unix.Fchmodat(unix.AT_FDCWD, dir+"/f", 0o2755, 0))
	try("open-creat-4755", closed(unix.Open(dir+"/s", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o4755)))
	try("openat-creat-2755", closed(unix.Openat(unix.AT_FDCWD, dir+"/sg", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o2755)))
	// A file capability (vfs_cap_data revision 2, effective, CAP_SETUID
	// permitted): the kernel asks for CAP_SETFCAP, which the program lacks.
	fcap := []byte{1, 0, 0, 2, 1 << unix.CAP_SETUID, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	try("setxattr-capability", unix.Setxattr(dir+"/g", "security.capability", fcap, 0))
	try("chmod-0755", unix.Chmod(dir+"/g", 0o755))
	try("open-creat-0644", closed(unix.Open(dir+"/new", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)))
	os.Exit(0)
}

// TestHostileGuestNoSetIDFilesInJail starts a stand-in for a taken-over QEMU
// (the test binary) as root starts a box's QEMU, with a read-write host
// directory of root's (and one of uid 1234's) shared into its jail: the
// program owns the directory's files through the idmapped mount, yet
// chmod 04755 and 02755 of a file, and open/openat with O_CREAT and mode
// 04755 or 02755, fail with EPERM and leave no setuid or setgid file on
// the host, as does a file capability (security.capability needs
// CAP_SETFCAP), while chmod 0755 and an ordinary create work.
func TestHostileGuestNoSetIDFilesInJail(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a uid of its own, idmapped mounts)")
	}
	self, err := filepath.Abs(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, owner := range []int{0, 1234} {
		t.Run(strconv.Itoa(owner), func(t *testing.T) {
			uid := 0x6b000000 + rand.IntN(1<<20)
			dir := t.TempDir()
			vol := filepath.Join(dir, "vol")
			if err := os.Mkdir(vol, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"f", "g"} {
				p := filepath.Join(vol, name)
				if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(p, owner, owner); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chown(vol, owner, owner); err != nil {
				t.Fatal(err)
			}
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			st, err := Start(Spec{
				Name: "test", Path: "/probe", Env: []string{setIDProbeEnv + "=/shares/v"},
				Root:   filepath.Join(dir, "jail"),
				Binds:  []string{"/usr", "/lib", "/lib64", "/etc/ld.so.cache"},
				Files:  []BindFile{{Src: self, Dst: "/probe"}},
				Shares: []ShareMount{{Src: vol, Dst: "/shares/v"}},
				UID:    uid, GID: uid,
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
			eperm := strconv.Itoa(int(unix.EPERM))
			want := map[string]string{"chmod-4755": eperm, "chmod-2755": eperm, "open-creat-4755": eperm,
				"openat-creat-2755": eperm, "setxattr-capability": eperm, "chmod-0755": "0", "open-creat-0644": "0"}
			for _, l := range strings.Split(string(out), "\n") {
				if k, v, ok := strings.Cut(l, "="); ok && want[k] != "" {
					if v != want[k] {
						t.Errorf("%s: errno %s, want %s", k, v, want[k])
					}
					delete(want, k)
				}
			}
			if len(want) > 0 {
				t.Errorf("the program did not report %v:\n%s", want, out)
			}
			for name, mode := range map[string]os.FileMode{"f": 0o644, "g": 0o755, "new": 0o644} {
				fi, err := os.Stat(filepath.Join(vol, name))
				if err != nil {
					t.Errorf("on the host: %v", err)
					continue
				}
				if fi.Mode().Perm() != mode || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
					t.Errorf("on the host, %s is %v, want %v", name, fi.Mode(), mode)
				}
			}
			for _, name := range []string{"s", "sg"} {
				if _, err := os.Lstat(filepath.Join(vol, name)); err == nil {
					t.Errorf("on the host, %s was created", name)
				}
			}
		})
	}
}

// TestHostileGuestNoSetIDCmd: a program started through NoSetIDCmd (as the virtio-fs
// daemons are, here a shell) cannot give a file S_ISUID or S_ISGID, nor
// make a setgid directory, while other modes work; its environment is
// the command's, without the stage's marker.
func TestHostileGuestNoSetIDCmd(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("/bin/sh", "-c", `cd "$0" && touch a b && `+
		`{ chmod 4755 a 2>/dev/null && echo SETUID; chmod g+s a 2>/dev/null && echo SETGID; mkdir -m 2755 d 2>/dev/null && echo SETGID-DIR; `+
		`chmod 755 b && mkdir e && echo PLAIN-OK; echo "ENV $MARK:$AIRLOCK_QEMU_JAIL_STAGE"; }`, dir)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "MARK=kept"}
	NoSetIDCmd(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	s := string(out)
	for _, bad := range []string{"SETUID", "SETGID", "SETGID-DIR"} {
		if strings.Contains(s, bad+"\n") {
			t.Errorf("%s worked:\n%s", bad, s)
		}
	}
	if !strings.Contains(s, "PLAIN-OK") || !strings.Contains(s, "ENV kept:\n") {
		t.Errorf("output:\n%s", s)
	}
	for _, name := range []string{"a", "b", "e"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s: %v %v", name, fi, err)
		}
	}
}
