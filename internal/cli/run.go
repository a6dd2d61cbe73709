package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/netstack"
)

// boxFlags are the flags shared by run and create.
type boxFlags struct {
	name     string
	env      []string
	workdir  string
	user     string
	cpus     int
	memory   string
	diskSize string
	net      netFlags
	rm       bool
	volumes  []string
	hostname string
	envFiles []string
	from     string
	labels   []string
	secrets  []string
	idle     time.Duration
	idleAct  string
}

func (f *boxFlags) add(cmd *cobra.Command, withRm bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.name, "name", "", "assign a name to the box")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable (KEY=VALUE), repeatable")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory inside the box")
	fl.StringVarP(&f.user, "user", "u", "", "user (name, uid, name:group or uid:gid)")
	fl.IntVar(&f.cpus, "cpus", 0, fmt.Sprintf("number of vCPUs (default %d)", airlock.DefaultCPUs))
	fl.StringVarP(&f.memory, "memory", "m", "", fmt.Sprintf("guest memory: 512m, 2g; a bare number is MiB (default %d MiB)", airlock.DefaultMemoryMiB))
	fl.StringVar(&f.diskSize, "disk-size", "", fmt.Sprintf("size of the writable layer: 8g, 512m; a bare number is MiB (default %d MiB)", airlock.DefaultDiskSizeMiB))
	fl.StringVar(&f.hostname, "hostname", "", "host name inside the box (default: the box name, else its id)")
	fl.StringArrayVar(&f.envFiles, "env-file", nil, "read environment variables from a file (KEY=VALUE lines; # comments), repeatable")
	fl.StringArrayVarP(&f.volumes, "volume", "v", nil, "attach a volume: HOSTDIR:BOXDIR[:ro|rw] (a host directory, shared live) or NAME:BOXDIR[:ro|rw] (a named volume), repeatable")
	f.net.add(cmd, true)
	fl.StringArrayVar(&f.secrets, "secret", nil, "pass a secret the box uses but never sees: NAME=HOST[,HOST...]; the box's $NAME is a placeholder that the host replaces by this shell's $NAME in the headers of HTTPS requests to those hosts (api.example.com, *.example.com); repeatable")
	if withRm {
		fl.BoolVar(&f.rm, "rm", false, "remove the box when the command exits")
	}
	fl.StringArrayVarP(&f.labels, "label", "l", nil, "set a label on the box (KEY=VALUE), repeatable; shown by inspect, matched by ls --filter label=KEY=VALUE")
	fl.DurationVar(&f.idle, "idle-timeout", 0, "act on the box (--idle-action) after this long with no exec, file or code call on it (nor traffic on its network, for stop and suspend), e.g. 10m; enforced while a Runtime is open on the home (airlock serve, node, the next airlock command)")
	fl.StringVar(&f.idleAct, "idle-action", "", "what --idle-timeout does: remove (default), stop, or suspend (pause to disk; the next exec, file call or inbound connection to a published port resumes it)")
	fl.StringVar(&f.from, "from", "", "restore the memory snapshot NAME instead of booting an image (no IMAGE argument; see 'airlock snapshot')")
}

func (f *boxFlags) options(cmd *cobra.Command, image string) (airlock.BoxOptions, error) {
	if cmd.Flags().Changed("cpus") && f.cpus < 1 {
		return airlock.BoxOptions{}, fmt.Errorf("--cpus %d: want 1..64", f.cpus)
	}
	fromFiles, err := envFiles(f.envFiles)
	if err != nil {
		return airlock.BoxOptions{}, err
	}
	env, err := envFlags(f.env)
	if err != nil {
		return airlock.BoxOptions{}, err
	}
	var vols []airlock.Volume
	for _, spec := range f.volumes {
		v, err := airlock.ParseVolume(spec)
		if err != nil {
			return airlock.BoxOptions{}, err
		}
		vols = append(vols, v)
	}
	mem, err := sizeFlag("memory", f.memory)
	if err != nil {
		return airlock.BoxOptions{}, err
	}
	if err := checkMemory(mem); err != nil {
		return airlock.BoxOptions{}, err
	}
	disk, err := sizeFlag("disk-size", f.diskSize)
	if err != nil {
		return airlock.BoxOptions{}, err
	}
	o := airlock.BoxOptions{
		Image: image, Name: f.name, Env: append(fromFiles, env...), WorkingDir: f.workdir, User: f.user,
		CPUs: f.cpus, MemoryMiB: mem, DiskSizeMiB: disk, AutoRemove: f.rm, Hostname: f.hostname,
		Volumes: vols, FromSnapshot: f.from, IdleTimeout: f.idle, IdleAction: airlock.IdleAction(f.idleAct),
	}
	if f.idle < 0 {
		return airlock.BoxOptions{}, fmt.Errorf("--idle-timeout %s: want a positive duration such as 10m", f.idle)
	}
	if f.idleAct != "" && f.idle == 0 {
		return airlock.BoxOptions{}, fmt.Errorf("--idle-action %s needs --idle-timeout DURATION", f.idleAct)
	}
	switch airlock.IdleAction(f.idleAct) {
	case "", airlock.IdleRemove, airlock.IdleStop, airlock.IdleSuspend:
	default:
		return airlock.BoxOptions{}, fmt.Errorf("--idle-action %q: want remove, stop or suspend", f.idleAct)
	}
	for _, l := range f.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return airlock.BoxOptions{}, fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		if o.Labels == nil {
			o.Labels = map[string]string{}
		}
		o.Labels[k] = v
	}
	if err := f.net.apply(&o); err != nil {
		return airlock.BoxOptions{}, err
	}
	if o.Secrets, err = secretFlags(f.secrets, os.LookupEnv); err != nil {
		return airlock.BoxOptions{}, err
	}
	if f.from != "" && !cmd.Flags().Changed("network") {
		o.Network = "" // the snapshot's
	}
	return o, nil
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

// secretFlags turns --secret NAME=HOST[,HOST...] values into secrets
// whose values are lookup(NAME), this process's environment: a value is
// never on a command line.
func secretFlags(in []string, lookup func(string) (string, bool)) (map[string]airlock.Secret, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := map[string]airlock.Secret{}
	for _, s := range in {
		name, hosts, ok := strings.Cut(s, "=")
		if !ok || name == "" || hosts == "" {
			return nil, fmt.Errorf("--secret %q: want NAME=HOST[,HOST...] (the value is this shell's $NAME)", s)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--secret %s given twice: list its hosts in one flag (NAME=HOST,HOST)", name)
		}
		if err := netstack.CheckSecretName(name); err != nil {
			return nil, fmt.Errorf("--secret: %w", err)
		}
		v, ok := lookup(name)
		if !ok {
			return nil, fmt.Errorf("--secret %s: $%s is not set in this shell: export it, and airlock passes its value to the box's network helper (never into the box)", name, name)
		}
		if v == "" {
			return nil, fmt.Errorf("--secret %s: $%s is empty in this shell: a secret's value is 1-%d bytes", name, name, airlock.MaxSecretValue)
		}
		out[name] = airlock.Secret{Value: v, Hosts: strings.Split(hosts, ",")}
	}
	return out, nil
}

// execFlags are the flags shared by run and exec.
type execFlags struct {
	timeout     time.Duration
	interactive bool
	tty         bool
	// main is set for the box's main command (run): its end is recorded
	// as the end of the box ("Exited (N)").
	main bool
}

func (f *execFlags) add(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&f.timeout, "timeout", 0, "kill the command (and everything it started) after this long, e.g. 30s; exit status 124")
	cmd.Flags().BoolVarP(&f.interactive, "interactive", "i", false, "pass standard input to the command")
	cmd.Flags().BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal in the box (with -i, this terminal in raw mode: a usable shell, resized with it)")
}

// runInBox runs argv in b, streaming output to the command's streams, and
// returns the exit code the CLI should end with. Signals airlock receives
// go to the command (see attach).
func runInBox(cmd *cobra.Command, b *airlock.Box, argv []string, opts airlock.ExecOptions, ef execFlags) (int, error) {
	return attach(cmd, b, argv, opts, ef)
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
	var detach bool
	var entrypoint string
	cmd := &cobra.Command{
		Use:   "run [flags] IMAGE [COMMAND [ARG...]]\n  airlock run [flags] --from SNAPSHOT [COMMAND [ARG...]]",
		Short: "Create a box, run a command in it, and stop it",
		Long: `Create a box from IMAGE, run COMMAND (default: the image's entrypoint and
command) with its output streamed to this terminal, then stop the box (and
remove it with --rm). The exit status is the command's; 128+N when a signal
killed it; 124 when --timeout fired; 125 when airlock itself failed.

-d (detached) prints the box id and returns; the command keeps running in the
box, its output is kept for 'airlock logs', and the box stops (or, with --rm,
is removed) when it ends. 'airlock ls -a' then shows "Exited (N)".

--memory (-m) and --disk-size take 512m, 2g, ...; a bare number is MiB.

With --from SNAPSHOT the box is restored from a memory snapshot ('airlock
snapshot create') instead: no IMAGE argument, and it runs on from where the
snapshot's box was, its processes included.`,
		Args: bf.imageOrFrom,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, rest, err := bf.imageOptions(cmd, args)
			if err != nil {
				return usagef(cmd, "run: %v", err)
			}
			if err := idleWithMain(opts); err != nil {
				return usagef(cmd, "run: %v", err)
			}
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			ctx := cmd.Context()
			if err := checkFromArgs(ctx, cmd, r, bf.from, rest); err != nil {
				return err
			}
			if detach {
				opts.AutoRemove = false // the detached supervisor removes it
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
			argv := mainArgv(b, rest, entrypoint)
			if len(argv) == 0 {
				cleanup()
				if bf.from != "" {
					return exitWith(cmd, 125, fmt.Errorf("the image of snapshot %s has no default command: give one after --from %s", bf.from, bf.from))
				}
				return exitWith(cmd, 125, fmt.Errorf("image %s has no default command: give one after the image name", opts.Image))
			}
			if detach {
				if err := startDetached(b, mainSpec{Argv: argv, Timeout: ef.timeout, Remove: bf.rm}); err != nil {
					cleanup()
					return exitWith(cmd, 125, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), b.ID())
				return nil
			}
			ef.main = true
			code, err := runInBox(cmd, b, argv, airlock.ExecOptions{}, ef)
			cleanup()
			return exitWith(cmd, code, err)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.SetFlagErrorFunc(flagError125)
	bf.add(cmd, true)
	ef.add(cmd)
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "run the command in the background and print the box id")
	cmd.Flags().StringVar(&entrypoint, "entrypoint", "", "run this program instead of the image's entrypoint (COMMAND becomes its arguments)")
	return cmd
}

// imageOrFrom checks the arguments of run and create: an IMAGE, or none
// with --from SNAPSHOT.
func (bf *boxFlags) imageOrFrom(cmd *cobra.Command, args []string) error {
	if bf.from == "" && len(args) == 0 {
		return fmt.Errorf("give an IMAGE (or --from SNAPSHOT)")
	}
	return nil
}

// imageOptions splits run's and create's arguments into the image (none
// with --from) and the command, and returns the box options.
func (bf *boxFlags) imageOptions(cmd *cobra.Command, args []string) (airlock.BoxOptions, []string, error) {
	img, rest := "", args
	if bf.from == "" {
		img, rest = args[0], args[1:]
	}
	opts, err := bf.options(cmd, img)
	return opts, rest, err
}

// idleWithMain refuses the idle actions stop and suspend for a box that
// runs a main command (run, create IMAGE COMMAND): the command is a use
// of the box for as long as it runs, so the box would never go idle.
func idleWithMain(opts airlock.BoxOptions) error {
	if a := opts.IdleAction; a == airlock.IdleStop || a == airlock.IdleSuspend {
		return fmt.Errorf("--idle-action %s: a box's main command keeps it in use while it runs, so it would never go idle; create the box without a command ('airlock create --idle-timeout ... --idle-action %s IMAGE') and start long-running programs in it in the background ('airlock exec BOX sh -c \"nohup PROGRAM >/tmp/PROGRAM.log 2>&1 &\"')", a, a)
	}
	return nil
}

// mainArgv is the box's main command: entrypoint (when given) followed by
// args; else args; else the image's default command.
func mainArgv(b *airlock.Box, args []string, entrypoint string) []string {
	if entrypoint != "" {
		return append([]string{entrypoint}, args...)
	}
	if len(args) > 0 {
		return args
	}
	return b.DefaultCommand()
}

func newCreateCmd() *cobra.Command {
	var bf boxFlags
	var entrypoint string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "create [flags] IMAGE [COMMAND [ARG...]]\n  airlock create [flags] --from SNAPSHOT [COMMAND [ARG...]]",
		Short: "Create and start a box; print its id",
		Long: `Create a box from IMAGE and boot it. The box keeps running after this
command returns; reach it with 'airlock exec', stop it with 'airlock stop',
remove it with 'airlock rm'.

With COMMAND (or --entrypoint), the box runs it as its main command in the
background, as 'run -d' does: its output is kept for 'airlock logs', and the
box stops when it ends.

--memory (-m) and --disk-size take 512m, 2g, ...; a bare number is MiB.`,
		Args: bf.imageOrFrom,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, rest, err := bf.imageOptions(cmd, args)
			if err != nil {
				return usagef(cmd, "create: %v", err)
			}
			if len(rest) > 0 || entrypoint != "" {
				if err := idleWithMain(opts); err != nil {
					return usagef(cmd, "create: %v", err)
				}
			}
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			if err := checkFromArgs(cmd.Context(), cmd, r, bf.from, rest); err != nil {
				return err
			}
			b, err := r.Create(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if len(rest) > 0 || entrypoint != "" {
				argv := mainArgv(b, rest, entrypoint)
				if err := startDetached(b, mainSpec{Argv: argv, Timeout: timeout}); err != nil {
					b.Remove(context.WithoutCancel(cmd.Context()), true)
					return err
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), b.ID())
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.SetFlagErrorFunc(flagError125)
	bf.add(cmd, false)
	cmd.Flags().StringVar(&entrypoint, "entrypoint", "", "run this program instead of the image's entrypoint (COMMAND becomes its arguments)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "kill the main command after this long, e.g. 30s")
	return cmd
}

// flagHint says what the value of the flag named in a flag error takes.
func flagHint(msg string) string {
	switch {
	case strings.Contains(msg, "--memory"), strings.Contains(msg, "--disk-size"):
		return "--memory and --disk-size take a size: 512m, 2g, or a bare number of MiB; "
	case strings.Contains(msg, "--timeout"):
		return "--timeout takes a duration with a unit, e.g. 30s or 2m; "
	case strings.Contains(msg, "--cpus"):
		return "--cpus takes a number of vCPUs, e.g. --cpus 2; "
	}
	return ""
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
