package qemu

import (
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/airlock-run/airlock/internal/confine"
	"github.com/airlock-run/airlock/internal/confine/jailstage"
)

// DefaultConsoleMax is the default size cap of a confined box's console
// log in bytes (8 MiB; Config.ConsoleMax).
const DefaultConsoleMax = jailstage.DefaultConsoleMax

// drainArg0 marks a re-execution of this program as a console drainer
// (package jailstage runs it).
const drainArg0 = jailstage.DrainArg0

// startDrainer starts the console drainer of a confined QEMU: a process of
// its own (in a session of its own, so that it outlives the caller as QEMU
// does) that copies what QEMU writes on the pipe whose read end is r into
// path, keeping at most max bytes (the newest; see drainConsole). It ends
// when QEMU has exited and the pipe is drained. With uid non-zero (the
// box's QEMU uid, as root) it runs as uid once it has opened the log.
func startDrainer(r *os.File, path string, max int64, g *confine.Cgroup, uid int) error {
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{drainArg0, path, strconv.FormatInt(max, 10), strconv.Itoa(uid)},
		Env:         []string{jailstage.Env + "=1"},
		ExtraFiles:  []*os.File{r},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	if g != nil {
		g.Add(cmd.Process.Pid)
	}
	go cmd.Wait() // reap it
	return nil
}

// drainConsole copies r to the file path until EOF, as a ring of about
// max bytes: when the file grows past max, its newest max/2 bytes move to
// its start and the rest is cut off (in place, through the one open
// descriptor: the drainer needs no access to the box directory). A reader
// that follows the file sees it shrink then (see airlock logs -f).
func drainConsole(r io.Reader, path string, max int64) { jailstage.DrainConsole(r, path, max, 0) }
