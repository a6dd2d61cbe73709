package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

func init() {
	extraCommands = append(extraCommands, newSnapshotCmd, newForkCmd, newPauseCmd, newUnpauseCmd)
}

func newSnapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Manage memory snapshots of running boxes",
		Long: `A snapshot holds a running box's memory, device state and writable layer,
taken at one paused instant; the box runs on afterwards. Restore it with
'airlock run --from NAME' or 'airlock create --from NAME': the new box runs
on from that instant, its processes included, with its own writable layer,
fresh kernel randomness, the host's time and its own hostname.`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "create BOX NAME",
		Short: "Snapshot a running box",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			info, err := b.Snapshot(cmd.Context(), args[1])
			if errors.Is(err, airlock.ErrSnapshotExists) {
				return snapshotExists(args[1])
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), info.Name)
			return nil
		},
	}, snapshotLsCmd(), &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a snapshot as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			s, err := r.Snapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			out, _ := json.MarshalIndent(s, "", "  ")
			fmt.Fprintln(cmd.OutOrStdout(), string(out))
			return nil
		},
	}, &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove"},
		Short:   "Remove snapshots (boxes restored from them keep working)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachName(cmd, args, func(ctx context.Context, r *airlock.Runtime, n string) error { return r.RemoveSnapshot(ctx, n) })
		},
	})
	return cmd
}

func newForkCmd() *cobra.Command {
	var n int
	var from string
	cmd := &cobra.Command{
		Use:   "fork BOX [-n N] [--from-checkpoint NAME]",
		Short: "Start N copies of a running box from its memory; print their ids",
		Long: `Snapshot the running box BOX (pausing it briefly) and start N boxes from
that snapshot, each with its own writable layer and the box's processes;
print one id per line. The snapshot is removed afterwards.

With --from-checkpoint NAME the boxes start from BOX's checkpoint NAME
(airlock checkpoint create) instead, any node of its tree; BOX is left
alone and need not run.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 || n > airlock.MaxForks {
				return usagef(cmd, "fork: -n %d: want 1..%d boxes", n, airlock.MaxForks)
			}
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			kids, err := b.Fork(cmd.Context(), n, airlock.ForkOptions{FromCheckpoint: from})
			if err != nil {
				return err
			}
			for _, k := range kids {
				fmt.Fprintln(cmd.OutOrStdout(), k.ID())
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "number", "n", 1, fmt.Sprintf("how many boxes to start (1..%d)", airlock.MaxForks))
	cmd.Flags().StringVar(&from, "from-checkpoint", "", "start them from the box's checkpoint NAME, not from the box as it is now")
	return cmd
}

func newPauseCmd() *cobra.Command {
	var toDisk bool
	cmd := &cobra.Command{
		Use:   "pause [--to-disk] BOX...",
		Short: "Pause running boxes (no guest CPU until unpause)",
		Long: `Pause running boxes: their vCPUs stop (no guest CPU) until unpause.
With --to-disk a box's memory and device state are saved under its box
directory and its VM stops, releasing its memory: unpause or start continue
it where it was (same processes and pids; open network connections do not
survive); stop continues it and shuts it down. A box whose main command
airlock follows (run -d, create IMAGE COMMAND) is refused: pause it in memory.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachBox(cmd, args, func(ctx context.Context, r *airlock.Runtime, b *airlock.Box) error {
				if toDisk {
					if mainRunning(b) {
						// Its background process follows the command over
						// an exec that stopping the VM would end, and then
						// stops the box.
						return fmt.Errorf("box %s runs its main command (run -d, or create IMAGE COMMAND), which airlock follows over a live connection that a pause to disk would cut: pause it in memory ('airlock pause %s'), or pause to disk a box created without a command (airlock create IMAGE, then exec)", b.ID(), b.ID())
					}
					return b.Suspend(ctx)
				}
				return b.Pause(ctx)
			})
		},
	}
	cmd.Flags().BoolVar(&toDisk, "to-disk", false, "save the memory to disk and stop the VM (memory released)")
	return cmd
}

func newUnpauseCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "unpause BOX...",
		Short: "Let paused boxes run on (also those paused to disk)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachBox(cmd, args, func(ctx context.Context, r *airlock.Runtime, b *airlock.Box) error {
				return b.Resume(ctx)
			})
		},
	}
}

// snapshotLsCmd is `airlock snapshot ls` (-q, --format as ls).
func snapshotLsCmd() *cobra.Command {
	var lf listFormat
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List snapshots",
		Long: `List snapshots. --format json prints one JSON object per snapshot; a Go
template one line each (fields: Name, Box, BoxName, Image, ImageDigest,
Created, StateBytes, DiskBytes, Options.MemoryMiB, ...); -q the names.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			list, err := r.Snapshots(cmd.Context())
			if err != nil {
				return err
			}
			return writeList(cmd.OutOrStdout(), lf, list, []column[airlock.SnapshotInfo]{
				{"NAME", func(s airlock.SnapshotInfo) string { return s.Name }},
				{"BOX", func(s airlock.SnapshotInfo) string { return s.Box }},
				{"IMAGE", func(s airlock.SnapshotInfo) string { return s.Image }},
				{"MEMORY", func(s airlock.SnapshotInfo) string { return fmt.Sprintf("%d MiB", s.Options.MemoryMiB) }},
				{"SIZE", func(s airlock.SnapshotInfo) string {
					return fmt.Sprintf("%.1f MiB", float64(s.StateBytes+s.DiskBytes)/(1<<20))
				}},
				{"CREATED", func(s airlock.SnapshotInfo) string { return humanDuration(time.Since(s.Created)) + " ago" }},
			})
		},
	}
	lf.add(cmd, "snapshot names")
	return cmd
}

// snapshotExists is snapshot create's error for a name in use: the
// library's says "remove it, or pick another name"; this one names the
// command, and is the only advice printed (no hint follows it).
func snapshotExists(name string) error {
	return fmt.Errorf("%w: %q: remove it first (airlock snapshot rm %s), or pick another name", airlock.ErrSnapshotExists, name, name)
}
