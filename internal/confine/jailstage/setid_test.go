//go:build amd64

package jailstage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setIDChildEnv makes the test binary install NoSetIDFilter (with
// no_new_privs) and try, in the directory the variable names, each of
// setIDCases, printing "name errno" lines (0 for success).
const setIDChildEnv = "AIRLOCK_TEST_SETID_CHILD"

// setIDCase is one system call the filter is tried with and the errno
// it must give (0: it runs).
type setIDCase struct {
	name string
	want syscall.Errno
	call func(dir string) error
}

func raw(nr uintptr, a ...uintptr) error {
	var args [6]uintptr
	copy(args[:], a)
	_, _, e := unix.Syscall6(nr, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		return e
	}
	return nil
}

// atFDCWD is AT_FDCWD as a system call argument.
var atFDCWD = uintptr(^uint(99)) // -100

// cstrs keeps cstr's strings reachable while the raw calls use them.
var cstrs []*byte

// cstr returns s as a C string's address for a raw system call.
func cstr(s string) uintptr {
	p, _ := unix.BytePtrFromString(s)
	cstrs = append(cstrs, p)
	return uintptr(unsafe.Pointer(p))
}

var setIDCases = []setIDCase{
	{"chmod 04755", unix.EPERM, func(d string) error { return raw(unix.SYS_CHMOD, cstr(d+"/f"), 0o4755) }},
	{"chmod 02755", unix.EPERM, func(d string) error { return raw(unix.SYS_CHMOD, cstr(d+"/f"), 0o2755) }},
	{"chmod 0755", 0, func(d string) error { return raw(unix.SYS_CHMOD, cstr(d+"/f"), 0o755) }},
	{"chmod 01777 (sticky)", 0, func(d string) error { return raw(unix.SYS_CHMOD, cstr(d+"/f"), 0o1777) }},
	{"chmod high bits|04755", unix.EPERM, func(d string) error { return raw(unix.SYS_CHMOD, cstr(d+"/f"), 1<<32|0o4755) }},
	{"fchmod 04755", unix.EPERM, func(d string) error {
		return withFD(d+"/f", func(fd int) error { return raw(unix.SYS_FCHMOD, uintptr(fd), 0o4755) })
	}},
	{"fchmod 0700", 0, func(d string) error {
		return withFD(d+"/f", func(fd int) error { return raw(unix.SYS_FCHMOD, uintptr(fd), 0o700) })
	}},
	{"fchmodat 02755", unix.EPERM, func(d string) error { return raw(unix.SYS_FCHMODAT, atFDCWD, cstr(d+"/f"), 0o2755) }},
	{"fchmodat 0644", 0, func(d string) error { return raw(unix.SYS_FCHMODAT, atFDCWD, cstr(d+"/f"), 0o644) }},
	{"fchmodat2 04755", unix.EPERM, func(d string) error { return raw(unix.SYS_FCHMODAT2, atFDCWD, cstr(d+"/f"), 0o4755, 0) }},
	{"open O_CREAT 04755", unix.EPERM, func(d string) error {
		return raw(unix.SYS_OPEN, cstr(d+"/o1"), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o4755)
	}},
	{"open O_CREAT 0755", 0, func(d string) error {
		return closed(unix.Open(d+"/o2", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o755))
	}},
	{"open no O_CREAT, mode 04755 ignored", 0, func(d string) error {
		return closed(rawFD(unix.SYS_OPEN, cstr(d+"/f"), unix.O_RDONLY|unix.O_CLOEXEC, 0o4755))
	}},
	{"openat O_CREAT 02755", unix.EPERM, func(d string) error {
		return raw(unix.SYS_OPENAT, atFDCWD, cstr(d+"/o3"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o2755)
	}},
	{"openat O_TMPFILE 04755", unix.EPERM, func(d string) error {
		return raw(unix.SYS_OPENAT, atFDCWD, cstr(d), unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o4755)
	}},
	{"openat O_CREAT 0644", 0, func(d string) error {
		return closed(unix.Openat(unix.AT_FDCWD, d+"/o4", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644))
	}},
	{"creat 04755", unix.EPERM, func(d string) error { return raw(unix.SYS_CREAT, cstr(d+"/o5"), 0o4755) }},
	{"mknod S_IFREG|04755", unix.EPERM, func(d string) error { return raw(unix.SYS_MKNOD, cstr(d+"/n1"), unix.S_IFREG|0o4755, 0) }},
	{"mknodat S_IFREG|02755", unix.EPERM, func(d string) error {
		return raw(unix.SYS_MKNODAT, atFDCWD, cstr(d+"/n2"), unix.S_IFREG|0o2755, 0)
	}},
	{"mknodat S_IFREG|0644", 0, func(d string) error { return unix.Mknodat(unix.AT_FDCWD, d+"/n3", unix.S_IFREG|0o644, 0) }},
	{"mkdir 02755", unix.EPERM, func(d string) error { return raw(unix.SYS_MKDIR, cstr(d+"/d1"), 0o2755) }},
	{"mkdirat 04755", unix.EPERM, func(d string) error { return raw(unix.SYS_MKDIRAT, atFDCWD, cstr(d+"/d2"), 0o4755) }},
	{"mkdir 0755", 0, func(d string) error { return unix.Mkdir(d+"/d3", 0o755) }},
	{"openat2", unix.ENOSYS, func(d string) error {
		how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC}
		return closed(unix.Openat2(unix.AT_FDCWD, d+"/f", &how))
	}},
	{"io_uring_setup", unix.ENOSYS, func(d string) error {
		var params [120]byte
		return raw(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])))
	}},
}

func withFD(path string, f func(int) error) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return f(fd)
}

func rawFD(nr uintptr, a ...uintptr) (int, error) {
	var args [6]uintptr
	copy(args[:], a)
	r, _, e := unix.Syscall6(nr, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

func closed(fd int, err error) error {
	if err == nil {
		unix.Close(fd)
	}
	return err
}

func init() {
	dir := os.Getenv(setIDChildEnv)
	if dir == "" {
		return
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println("no_new_privs:", err)
		os.Exit(3)
	}
	if err := NoSetIDFilter(); err != nil {
		fmt.Println(err)
		os.Exit(3)
	}
	for _, c := range setIDCases {
		err := c.call(dir)
		var e syscall.Errno
		if err != nil {
			e, _ = err.(syscall.Errno)
		}
		fmt.Printf("%s=%d\n", c.name, int(e))
	}
	os.Exit(0)
}

// TestHostileGuestNoSetIDFilter runs the test binary under NoSetIDFilter (the filter
// the launcher stage installs before it execs a box's QEMU, and the
// virtio-fs daemons run under): every way to give a file S_ISUID or
// S_ISGID (chmod, fchmod, fchmodat, fchmodat2, open and openat with
// O_CREAT or O_TMPFILE, creat, mknod(at), mkdir(at)) fails with EPERM and
// leaves no file, while the same calls without those bits, the sticky bit
// and an open without O_CREAT work; openat2 and io_uring_setup fail with
// ENOSYS. No root needed (no_new_privs).
func TestHostileGuestNoSetIDFilter(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = []string{setIDChildEnv + "=" + dir}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			got[k] = v
		}
	}
	for _, c := range setIDCases {
		if want := fmt.Sprint(int(c.want)); got[c.name] != want {
			t.Errorf("%s: errno %s, want %d (%v)\n%s", c.name, got[c.name], c.want, c.want, out)
		}
	}
	// Nothing the refused calls named exists; nothing in dir is setuid
	// or setgid.
	for _, name := range []string{"o1", "o3", "o5", "n1", "n2", "d1", "d2"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			t.Errorf("%s was created", name)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) < 5 {
		t.Errorf("the allowed creates left %d entries", len(ents))
	}
	for _, e := range ents {
		fi, err := os.Lstat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s is %v", e.Name(), fi.Mode())
		}
	}
}
