package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/boxdir"
)

// A detached main command (run -d, create IMAGE COMMAND) is run by a
// background airlock process, 'airlock __main BOX', started in its own
// session: it execs the command, keeps its output in the box's main log,
// records its exit status ("Exited (N)"), then stops the box (or removes
// it, for run -d --rm), as a container stops when its main process ends.
const (
	fileMainSpec = boxdir.MainSpec // mainSpec
	fileMainDone = boxdir.MainDone // written when the main command has ended and the box stopped
)

// mainSpec is a box's main command.
type mainSpec struct {
	Argv    []string      `json:"argv"`
	Timeout time.Duration `json:"timeout,omitempty"`
	// Remove removes the box when the command ends (run -d --rm).
	Remove bool `json:"remove,omitempty"`
}

func init() { extraCommands = append(extraCommands, newMainCmd) }

// readMainSpec returns the box's main command, if it has one.
func readMainSpec(b *airlock.Box) (mainSpec, bool) {
	var m mainSpec
	raw, err := os.ReadFile(filepath.Join(boxDir(b), fileMainSpec))
	if err != nil || len(raw) > 1<<20 || json.Unmarshal(raw, &m) != nil || len(m.Argv) == 0 {
		return mainSpec{}, false
	}
	return m, true
}

// mainRunning reports whether b's main command is being followed by its
// background process (it has one that has not ended).
func mainRunning(b *airlock.Box) bool {
	if _, ok := readMainSpec(b); !ok {
		return false
	}
	_, err := os.Stat(filepath.Join(boxDir(b), fileMainDone))
	return os.IsNotExist(err)
}

// startDetached records m as b's main command and starts the background
// process that runs it.
func startDetached(b *airlock.Box, m mainSpec) error {
	raw, _ := json.Marshal(m)
	dir := boxDir(b)
	os.Remove(filepath.Join(dir, fileMainDone))
	if err := os.WriteFile(filepath.Join(dir, fileMainSpec), raw, 0o600); err != nil {
		return err
	}
	// The log exists before this returns: logs -f at once follows it.
	if l, err := openMainLog(b); err == nil {
		l.Close()
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("run the main command in the background: %w", err)
	}
	c := exec.Command(self, "__main", b.ID())
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	c.Env = append(os.Environ(), "AIRLOCK_QUIET=1")
	if err := c.Start(); err != nil {
		return fmt.Errorf("run the main command in the background: %w", err)
	}
	return c.Process.Release()
}

func newMainCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "__main BOX",
		Short:  "Run a box's detached main command (started by run -d and create)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			m, ok := readMainSpec(b)
			if !ok {
				return fmt.Errorf("box %s has no main command", b.ID())
			}
			l, err := openMainLog(b)
			if err != nil {
				return err
			}
			ow, ew := &streamWriter{l: l, stream: "stdout"}, &streamWriter{l: l, stream: "stderr"}
			// Interrupting this process (airlock stop sends none; a
			// shutdown of the host may) kills the command.
			ctx := cmd.Context()
			_, err = func() (*airlock.ExecResult, error) {
				p, err := b.ExecStream(ctx, m.Argv[0], m.Argv[1:], airlock.ExecOptions{Timeout: m.Timeout,
					Stdin: strings.NewReader(""), Stdout: ow, Stderr: ew, Main: true})
				if err != nil {
					return nil, err
				}
				return p.Wait()
			}()
			ow.flush()
			ew.flush()
			if err != nil {
				fmt.Fprintf(ew, "airlock: %v\n", err)
				ew.flush()
			}
			l.Close()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if m.Remove {
				return b.Remove(sctx, true)
			}
			err = b.Stop(sctx)
			// After the stop: logs -f ends here, and a start that follows
			// finds the box stopped.
			os.WriteFile(filepath.Join(boxDir(b), fileMainDone), nil, 0o600)
			return err
		},
	}
}
