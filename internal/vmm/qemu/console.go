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
	if len(os.Args) == 3 && os.Args[0] == drainArg0 && os.Getenv(stageEnv) == "1" {
		max, _ := strconv.ParseInt(os.Args[2], 10, 64)
		drainConsole(os.NewFile(3, "console"), os.Args[1], max)
		os.Exit(0)
	}
}

// startDrainer starts the console drainer of a confined QEMU: a process of
// its own (in a session of its own, so that it outlives the caller as QEMU
// does) that copies what QEMU writes on the returned pipe into path,
// keeping at most max bytes (the newest; see drainConsole). It ends when
// QEMU has exited and the pipe is drained.
func startDrainer(path string, max int64, g *Cgroup) (w *os.File, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{drainArg0, path, strconv.FormatInt(max, 10)},
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
// max bytes: when the file grows past max, its newest max/2 bytes replace
// it (renamed into place, so readers see either the old or the new file).
func drainConsole(r io.Reader, path string, max int64) {
	if max <= 0 {
		max = DefaultConsoleMax
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		io.Copy(io.Discard, r)
		return
	}
	size := int64(0)
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			f.Write(buf[:n])
			size += int64(n)
			if size > max {
				if nf, ns := rotate(f, path, max/2); nf != nil {
					f, size = nf, ns
				}
			}
		}
		if err != nil {
			f.Close()
			return
		}
	}
}

// rotate replaces path by its last keep bytes and returns the new file
// open for appending.
func rotate(f *os.File, path string, keep int64) (*os.File, int64) {
	src, err := os.Open(path)
	if err != nil {
		return nil, 0
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return nil, 0
	}
	off := fi.Size() - keep
	if off < 0 {
		off = 0
	}
	tmp := path + ".ring"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, 0
	}
	n, err := io.Copy(dst, io.NewSectionReader(src, off, fi.Size()-off))
	if err != nil {
		dst.Close()
		os.Remove(tmp)
		return nil, 0
	}
	if err := os.Rename(tmp, path); err != nil {
		dst.Close()
		os.Remove(tmp)
		return nil, 0
	}
	f.Close()
	dst.Close()
	nf, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0
	}
	return nf, n
}
