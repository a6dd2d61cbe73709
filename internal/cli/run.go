package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

// boxFlags are the flags shared by run and create.
type boxFlags struct {
	name     string
	env      []string
	workdir  string
	user     string
	cpus     int
	memory   int
	diskSize int
	network  string
	rm       bool
}

func (f *boxFlags) add(cmd *cobra.Command, withRm bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.name, "name", "", "assign a name to the box")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable (KEY=VALUE), repeatable")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory inside the box")
	fl.StringVarP(&f.user, "user", "u", "", "user (name, uid, name:group or uid:gid)")
	fl.IntVar(&f.cpus, "cpus", 0, fmt.Sprintf("number of vCPUs (default %d)", airlock.DefaultCPUs))
	fl.IntVar(&f.memory, "memory", 0, fmt.Sprintf("guest memory in MiB (default %d)", airlock.DefaultMemoryMiB))
	fl.IntVar(&f.diskSize, "disk-size", 0, fmt.Sprintf("size of the writable layer in MiB (default %d)", airlock.DefaultDiskSizeMiB))
	fl.StringVar(&f.network, "network", airlock.NetworkEnabled, "network access: enabled (outbound through the host) or disabled")
	if withRm {
		fl.BoolVar(&f.rm, "rm", false, "remove the box when the command exits")
	}
}

func (f *boxFlags) options(cmd *cobra.Command, image string) (airlock.BoxOptions, error) {
	if cmd.Flags().Changed("cpus") && f.cpus < 1 {
		return airlock.BoxOptions{}, fmt.Errorf("--cpus %d: want 1..64", f.cpus)
	}
	env, err := envFlags(f.env)
	if err != nil {
		return airlock.BoxOptions{}, err
	}
	return airlock.BoxOptions{
		Image: image, Name: f.name, Env: env, WorkingDir: f.workdir, User: f.user,
		CPUs: f.cpus, MemoryMiB: f.memory, DiskSizeMiB: f.diskSize, Network: f.network, AutoRemove: f.rm,
	}, nil
}

// envFlags turns -e values into KEY=VALUE entries, as the Docker CLI does:
// KEY=VALUE is taken as it is; a bare KEY passes this process's value of
// KEY, or nothing when KEY is unset here.
func envFlags(in []string) ([]string, error) {
	var out []string
	for _, e := range in {
		k, _, hasValue := strings.Cut(e, "=")
		if k == "" || strings.ContainsAny(k, " \t\n\x00") {
			return nil, fmt.Errorf("-e %q: want KEY=VALUE, or KEY to pass this shell's value", e)
		}
		if hasValue {
			out = append(out, e)
		} else if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	return out, nil
}

// execFlags are the flags shared by run and exec.
type execFlags struct {
	timeout     time.Duration
	interactive bool
}

func (f *execFlags) add(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&f.timeout, "timeout", 0, "kill the command (and everything it started) after this long, e.g. 30s; exit status 124")
	cmd.Flags().BoolVarP(&f.interactive, "interactive", "i", false, "pass standard input to the command")
}

// runInBox runs argv in b, streaming output to the command's streams, and
// returns the exit code the CLI should end with.
func runInBox(cmd *cobra.Command, b *airlock.Box, argv []string, opts airlock.ExecOptions, ef execFlags) (int, error) {
	ctx := cmd.Context()
	opts.Timeout = ef.timeout
	if ef.interactive {
		opts.Stdin = cmd.InOrStdin()
	}
	p, err := b.ExecStreamWriters(ctx, argv[0], argv[1:], opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
	if err != nil {
		return 125, err
	}
	res, err := p.Wait()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(cmd.ErrOrStderr(), "airlock: interrupted; the command and its children were killed")
			return 130, nil
		}
		return 125, err
	}
	if res.TimedOut {
		fmt.Fprintf(cmd.ErrOrStderr(), "airlock: command timed out after %s; it and every process it started were killed\n", ef.timeout)
		return 124, nil
	}
	return res.ExitCode, nil
}

// exitWith reports err (if any) on stderr and ends the command with code.
func exitWith(cmd *cobra.Command, code int, err error) error {
	if err != nil {
		report(cmd.ErrOrStderr(), err, "")
	}
	if code != 0 {
		return &ExitError{code}
	}
	return nil
}

func newRunCmd() *cobra.Command {
	var bf boxFlags
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "run [flags] IMAGE [COMMAND [ARG...]]",
		Short: "Create a box, run a command in it, and stop it",
		Long: `Create a box from IMAGE, run COMMAND (default: the image's entrypoint and
command) with its output streamed to this terminal, then stop the box (and
remove it with --rm). The exit status is the command's; 128+N when a signal
killed it; 124 when --timeout fired; 125 when airlock itself failed.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			ctx := cmd.Context()
			opts, err := bf.options(cmd, args[0])
			if err != nil {
				return exitWith(cmd, 125, err)
			}
			b, err := r.Create(ctx, opts)
			if err != nil {
				return exitWith(cmd, 125, err)
			}
			cleanup := func() {
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var err error
				if bf.rm {
					err = b.Remove(cctx, true)
				} else {
					err = b.Stop(cctx)
				}
				if err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "airlock:", err)
				}
			}
			argv := args[1:]
			if len(argv) == 0 {
				argv = b.DefaultCommand()
			}
			if len(argv) == 0 {
				cleanup()
				return exitWith(cmd, 125, fmt.Errorf("image %s has no default command: give one after the image name", args[0]))
			}
			code, err := runInBox(cmd, b, argv, airlock.ExecOptions{}, ef)
			cleanup()
			return exitWith(cmd, code, err)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.SetFlagErrorFunc(flagError125)
	bf.add(cmd, true)
	ef.add(cmd)
	return cmd
}

// flagError125 reports a bad flag of run or exec with exit status 125, as
// Docker does, and says what the flag named in err takes.
func flagError125(cmd *cobra.Command, err error) error {
	fmt.Fprintf(cmd.ErrOrStderr(), "airlock: %v\n(%ssee 'airlock %s --help')\n", err, flagHint(err.Error()), cmd.Name())
	return &ExitError{125}
}

// flagHint says what the value of the flag named in a flag error takes.
func flagHint(msg string) string {
	switch {
	case strings.Contains(msg, "--memory"), strings.Contains(msg, "--disk-size"):
		return "--memory and --disk-size take MiB, e.g. --memory 1024; "
	case strings.Contains(msg, "--timeout"):
		return "--timeout takes a duration with a unit, e.g. 30s or 2m; "
	case strings.Contains(msg, "--cpus"):
		return "--cpus takes a number of vCPUs, e.g. --cpus 2; "
	}
	return ""
}

func newCreateCmd() *cobra.Command {
	var bf boxFlags
	cmd := &cobra.Command{
		Use:   "create [flags] IMAGE",
		Short: "Create and start a box; print its id",
		Long: `Create a box from IMAGE and boot it. The box keeps running after this
command returns; reach it with 'airlock exec', stop it with 'airlock stop',
remove it with 'airlock rm'.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			opts, err := bf.options(cmd, args[0])
			if err != nil {
				return err
			}
			b, err := r.Create(cmd.Context(), opts)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), b.ID())
			return nil
		},
	}
	bf.add(cmd, false)
	return cmd
}

func newExecCmd() *cobra.Command {
	var ef execFlags
	var env []string
	var workdir, user string
	cmd := &cobra.Command{
		Use:   "exec [flags] BOX COMMAND [ARG...]",
		Short: "Run a command in a running box",
		Long: `Run COMMAND in the running box BOX (id, id prefix or name), streaming its
output. The exit status is the command's (124 on --timeout, 125 when airlock
failed).`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			env, err := envFlags(env)
			if err != nil {
				return exitWith(cmd, 125, err)
			}
			b, err := r.Get(cmd.Context(), args[0])
			if err != nil {
				return exitWith(cmd, 125, err)
			}
			code, err := runInBox(cmd, b, args[1:], airlock.ExecOptions{Env: env, WorkingDir: workdir, User: user}, ef)
			return exitWith(cmd, code, err)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.SetFlagErrorFunc(flagError125)
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "set an environment variable (KEY=VALUE), repeatable")
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory inside the box")
	cmd.Flags().StringVarP(&user, "user", "u", "", "user (name, uid, name:group or uid:gid)")
	ef.add(cmd)
	return cmd
}
