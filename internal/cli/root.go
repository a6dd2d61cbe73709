// Package cli is the airlock command line (cobra), one file per verb. Verbs
// follow Docker CLI conventions where they overlap (run, create, exec, ls,
// start, stop, rm, logs, images, pull, rmi, save, import).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

// ExitError ends the program with Code, printing nothing more (the command
// already reported what happened).
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Streams are the standard streams a command uses (tests replace them).
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
}

// NewRoot returns the airlock command tree.
func NewRoot(s Streams) *cobra.Command {
	root := &cobra.Command{
		Use:   "airlock",
		Short: "Run untrusted code in microVMs",
		Long: `airlock runs code nobody has reviewed — above all code written by a language
model — inside a QEMU microVM with its own kernel, and hands back the result.

Boxes are VMs made from OCI images. Environment: AIRLOCK_HOME (boxes and
images, default ~/.airlock), AIRLOCK_CACHE (kernels and root filesystem
bases, default ~/.cache/airlock), AIRLOCK_ACCEL (kvm, tcg or auto),
AIRLOCK_QUIET=1 (no warnings, as --quiet).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       clientVersion(),
	}
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.Err)
	root.AddCommand(
		newRunCmd(),
		newCreateCmd(),
		newExecCmd(),
		newLsCmd(),
		newStartCmd(),
		newStopCmd(),
		newRmCmd(),
		newLogsCmd(),
		newDoctorCmd(),
	)
	for _, f := range extraCommands {
		root.AddCommand(f())
	}
	root.PersistentFlags().BoolVar(&quietFlag, "quiet", false, "print no warnings (as AIRLOCK_QUIET=1)")
	finishTree(root)
	return root
}

// extraCommands lets other files of this package register verbs.
var extraCommands []func() *cobra.Command

// Main runs the CLI with args and returns the process exit code.
func Main(args []string) int {
	s := Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}
	root := NewRoot(s)
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	var ue *usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		printUsageError(s.Err, err)
		return ExitUsage
	}
	report(s.Err, err, "")
	if errors.Is(err, airlock.ErrInvalidArgument) {
		return ExitUsage
	}
	return 1
}

// openRuntime opens the runtime with warnings going to the command's
// stderr.
func openRuntime(cmd *cobra.Command) (*airlock.Runtime, error) {
	return openRuntimeObserved(cmd, nil)
}

// openRuntimeObserved is openRuntime with obs as the Runtime's observer
// (nil: none).
func openRuntimeObserved(cmd *cobra.Command, obs airlock.Observer) (*airlock.Runtime, error) {
	errw := cmd.ErrOrStderr()
	opts := airlock.Options{Warn: warner(errw), Pull: pullWithProgress(cmd.Context(), errw), Observer: obs}
	if r, ok, err := openTestDriver(opts); ok {
		return r, err
	}
	return airlock.Open(opts)
}
