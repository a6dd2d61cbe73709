package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

func newLsCmd() *cobra.Command {
	var lf listFormat
	var all bool
	var filters []string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"ps"},
		Short:   "List running and paused boxes (-a: all)",
		Long: `List running boxes and boxes paused to disk (pause --to-disk: they hold no
host memory, but unpause continues them); with -a, all boxes. STATUS says
since when a box is up, or why it stopped: "Exited (N)" (its main command
ended with status N), "OOM killed", "VM died: CAUSE", "Stopped" (airlock
stop), "Paused to disk".

--format json prints one JSON object per box; a Go template prints one line
per box: --format '{{.ID}} {{.Status}}'; 'table {{.ID}}\t{{.Name}}' adds a
header. Fields: ID, Name, Image, State, Status, Reason, ExitCode, CPUs,
Memory, Created, Started, Ports, Labels.

--filter label=KEY=VALUE lists the boxes with that label (label=KEY: with
the key, whatever its value); repeated filters must all match.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			match, err := labelFilter(filters)
			if err != nil {
				return usagef(cmd, "ls: %v", err)
			}
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			boxes, err := r.List(cmd.Context())
			if err != nil {
				return err
			}
			var rows []boxRow
			for _, b := range boxes {
				if (all || b.State == airlock.BoxRunning || b.Suspended) && match(b.Options.Labels) {
					rows = append(rows, rowOf(r, b))
				}
			}
			return writeList(cmd.OutOrStdout(), lf, rows, []column[boxRow]{
				{"BOX ID", func(b boxRow) string { return b.ID }},
				{"NAME", func(b boxRow) string { return b.Name }},
				{"IMAGE", func(b boxRow) string { return b.Image }},
				{"STATUS", func(b boxRow) string { return b.Status }},
				{"CPUS", func(b boxRow) string { return fmt.Sprint(b.CPUs) }},
				{"MEMORY", func(b boxRow) string { return b.Memory }},
				{"CREATED", func(b boxRow) string { return humanDuration(time.Since(b.Created)) + " ago" }},
				{"PORTS", func(b boxRow) string { return b.Ports }},
			})
		},
	}
	lf.add(cmd, "box ids")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "list all boxes (default: running ones and those paused to disk)")
	cmd.Flags().StringArrayVarP(&filters, "filter", "f", nil, "list only the boxes with a label: label=KEY=VALUE or label=KEY, repeatable")
	return cmd
}

// labelFilter turns ls --filter values (label=KEY=VALUE, label=KEY) into
// a test of a box's labels, all of which must hold.
func labelFilter(filters []string) (func(map[string]string) bool, error) {
	type want struct {
		key, value string
		any        bool
	}
	var ws []want
	for _, f := range filters {
		kv, ok := strings.CutPrefix(f, "label=")
		if !ok {
			return nil, fmt.Errorf("--filter %q: want label=KEY=VALUE or label=KEY (the only filter there is)", f)
		}
		k, v, hasValue := strings.Cut(kv, "=")
		if k == "" {
			return nil, fmt.Errorf("--filter %q: empty label key", f)
		}
		ws = append(ws, want{key: k, value: v, any: !hasValue})
	}
	return func(labels map[string]string) bool {
		for _, w := range ws {
			v, ok := labels[w.key]
			if !ok || (!w.any && v != w.value) {
				return false
			}
		}
		return true
	}, nil
}

// eachBox runs f on every named box, reporting errors per box like Docker.
// openBox opens the runtime and gets the box idOrName; the caller closes
// the runtime (on error it is closed here).
func openBox(cmd *cobra.Command, idOrName string) (*airlock.Runtime, *airlock.Box, error) {
	r, err := openRuntime(cmd)
	if err != nil {
		return nil, nil, err
	}
	b, err := r.Get(cmd.Context(), idOrName)
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, b, nil
}

func eachBox(cmd *cobra.Command, names []string, f func(ctx context.Context, r *airlock.Runtime, b *airlock.Box) error) error {
	return eachName(cmd, names, func(ctx context.Context, r *airlock.Runtime, n string) error {
		b, err := r.Get(ctx, n)
		if err != nil {
			return err
		}
		return f(ctx, r, b)
	})
}

// eachName runs f for each name as `docker rm A B` does: a name that fails
// is reported (with a hint) and the others go on; each that worked is
// printed; the exit status is 1 if any failed.
func eachName(cmd *cobra.Command, names []string, f func(ctx context.Context, r *airlock.Runtime, name string) error) error {
	r, err := openRuntime(cmd)
	if err != nil {
		return err
	}
	defer r.Close()
	failed := false
	for _, n := range names {
		if err := f(cmd.Context(), r, n); err != nil {
			report(cmd.ErrOrStderr(), err, n)
			failed = true
			continue
		}
		fmt.Fprintln(cmd.OutOrStdout(), n)
	}
	if failed {
		return &ExitError{1}
	}
	return nil
}

func newStartCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "start BOX...",
		Short: "Start stopped boxes (their files are kept)",
		Long: `Boot stopped boxes again; files written in them are still there. A box
made with a main command (run -d, create IMAGE COMMAND) runs it again, in the
background, its output appended to what 'airlock logs' shows.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachBox(cmd, args, func(ctx context.Context, _ *airlock.Runtime, b *airlock.Box) error {
				info, err := b.Info(ctx)
				if err != nil {
					return err
				}
				if err := b.Start(ctx); err != nil {
					return err
				}
				// A box with a main command runs it again, as a container
				// does (not when it was running already).
				if m, ok := readMainSpec(b); ok && info.State != airlock.BoxRunning {
					return startDetached(b, m)
				}
				return nil
			})
		},
	}
}

func newStopCmd() *cobra.Command {
	var seconds int
	cmd := &cobra.Command{
		Use:   "stop [-t SECONDS] BOX...",
		Short: "Stop running boxes (shut down cleanly, then force)",
		Long: `Stop running boxes: the guest agent stops every process, syncs and unmounts
the writable layer and powers off; a box that has not gone after -t seconds
(default 10) is told to quit, then killed. Files written in a box are kept
for its next start.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if seconds < 0 {
				return usagef(cmd, "stop: -t %d: want 0 or more seconds", seconds)
			}
			return eachBox(cmd, args, func(ctx context.Context, _ *airlock.Runtime, b *airlock.Box) error {
				grace := time.Duration(seconds) * time.Second
				if seconds == 0 {
					grace = -1 // at once
				}
				return b.Stop(ctx, airlock.StopOptions{Grace: grace})
			})
		},
	}
	cmd.Flags().IntVarP(&seconds, "time", "t", 10, "seconds to wait for a clean shutdown before forcing it")
	return cmd
}

func newRmCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm [-f] BOX...",
		Short: "Remove boxes (their VM, writable layer and record)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachBox(cmd, args, func(ctx context.Context, r *airlock.Runtime, b *airlock.Box) error {
				err := b.Remove(ctx, force)
				if errors.Is(err, airlock.ErrBoxRunning) {
					return fmt.Errorf("box %s is running: stop it first, or use rm -f", b.ID())
				}
				return err
			})
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "kill and remove running boxes")
	return cmd
}
