package qemu

import (
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// DefaultConsoleMax is the default size cap of a confined box's console
// log in bytes (8 MiB; Config.ConsoleMax).
const DefaultConsoleMax = 8 << 20

// drainArg0 marks a re-execution of this program as a console drainer.
const drainArg0 = "airlock-console-drain"

func init() {
	if len(os.Args) == 4 && os.Args[0] == drainArg0 && os.Getenv(stageEnv) == "1" {
		max, _ := strconv.ParseInt(os.Args[2], 10, 64)
		uid, _ := strconv.Atoi(os.Args[3])
		drainConsoleAs(os.NewFile(3, "console"), os.Args[1], max, uid)
		os.Exit(0)
	}
}

// startDrainer starts the console drainer of a confined QEMU: a process of
// its own (in a session of its own, so that it outlives the caller as QEMU
// does) that copies what QEMU writes on the returned pipe into path,
// keeping at most max bytes (the newest; see drainConsole). It ends when
// QEMU has exited and the pipe is drained. With uid non-zero (the box's
// QEMU uid, as root) it runs as uid once it has opened the log.
func startDrainer(path string, max int64, g *Cgroup, uid int) (w *os.File, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{drainArg0, path, strconv.FormatInt(max, 10), strconv.Itoa(uid)},
		Env:         []string{stageEnv + "=1"},
		ExtraFiles:  []*os.File{r},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	if g != nil {
		g.Add(cmd.Process.Pid)
	}
	go cmd.Wait() // reap it
	return w, nil
}

// drainConsole copies r to the file path until EOF, as a ring of about
// max bytes: when the file grows past max, its newest max/2 bytes move to
// its start and the rest is cut off (in place, through the one open
// descriptor: the drainer needs no access to the box directory). A reader
// that follows the file sees it shrink then (see airlock logs -f).
func drainConsole(r io.Reader, path string, max int64) { drainConsoleAs(r, path, max, 0) }

// drainConsoleAs is drainConsole that, with uid non-zero and as root,
// gives up root for uid (no groups, no capabilities) once the log is open.
func drainConsoleAs(r io.Reader, path string, max int64, uid int) {
	if max <= 0 {
		max = DefaultConsoleMax
	}
	// Not O_APPEND (rotate writes at offsets): the drainer is the file's
	// only writer and keeps its offset at the end.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		io.Copy(io.Discard, r)
		return
	}
	if uid != 0 && os.Geteuid() == 0 {
		// All threads (Go's set*id); a uid change from root clears every
		// capability. The drainer never execs.
		if syscall.Setgroups([]int{}) != nil || syscall.Setresgid(uid, uid, uid) != nil || syscall.Setresuid(uid, uid, uid) != nil {
			io.Copy(io.Discard, r)
			return
		}
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		size = 0
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			f.Write(buf[:n])
			size += int64(n)
			if size > max {
				size = rotate(f, size, max/2)
			}
		}
		if err != nil {
			f.Close()
			return
		}
	}
}

// rotate moves the last keep bytes of f (size bytes long) to its start,
// cuts it there and returns its new size.
func rotate(f *os.File, size, keep int64) int64 {
	off := size - keep
	if off <= 0 {
		return size
	}
	buf := make([]byte, 64<<10)
	var at int64
	for at < keep {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), keep-at)], off+at)
		if n > 0 {
			if _, werr := f.WriteAt(buf[:n], at); werr != nil {
				break
			}
			at += int64(n)
		}
		if err != nil {
			break
		}
	}
	if f.Truncate(at) != nil {
		return size
	}
	if _, err := f.Seek(at, io.SeekStart); err != nil {
		return size
	}
	return at
}
