package confine

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/airlock-run/airlock/internal/confine/jailstage"
)

// Keeper kills the processes it watches when this process ends (or
// closes it), unless they were let go first: a machine that must not
// outlive the process that made it but may be handed on later (a warm
// pool's box, which a claim can turn into a box that outlives the
// process) cannot use a parent-death signal, which cannot be taken back.
// It is a re-execution of this program (jailstage.Keep) in a session of
// its own, holding the read end of a pipe whose write end only this
// process holds. The zero Keeper is ready; it starts its process at the
// first Watch.
type Keeper struct {
	mu  sync.Mutex
	w   *os.File
	err error
}

// Watch has the keeper kill pid (started at start, /proc/PID/stat field
// 22) when this process ends or Close is called, unless Release(pid)
// comes first. The error says why the keeper could not start.
func (k *Keeper) Watch(pid int, start uint64) error {
	return k.send(fmt.Sprintf("w %d %d\n", pid, start), true)
}

// Release lets pid (started at start) go: the keeper no longer kills it.
func (k *Keeper) Release(pid int, start uint64) { k.send(fmt.Sprintf("r %d %d\n", pid, start), false) }

// Close ends the keeper, which kills what it still watches.
func (k *Keeper) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.w != nil {
		k.w.Close()
		k.w = nil
	}
	k.err = os.ErrClosed
}

func (k *Keeper) send(line string, start bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.w == nil && k.err == nil && start {
		k.w, k.err = startKeeper()
	}
	if k.w == nil {
		return k.err
	}
	_, err := k.w.WriteString(line) // a line is far below PIPE_BUF
	return err
}

func startKeeper() (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{jailstage.KeeperArg0},
		Env:         []string{jailstage.Env + "=1"},
		ExtraFiles:  []*os.File{r},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start the machine keeper: %w", err)
	}
	go cmd.Wait() // reap it
	return w, nil
}
