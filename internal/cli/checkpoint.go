package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/checkpoint"
)

func init() {
	extraCommands = append(extraCommands, newCheckpointCmd, newRollbackCmd)
}

func newCheckpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Manage a box's checkpoints (in-place undo points; see rollback)",
		Long: `A checkpoint holds a running box's memory, devices and writable layer at one
paused instant, kept in the box's directory and removed with the box.
'airlock rollback BOX NAME' returns the box to it in place: same id, name,
published ports and network policy; processes, files and memory as they
were. Checkpoints form a tree: each records the one the box was last
checkpointed at or rolled back to as its parent, so one taken after a
rollback starts a branch.`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "create BOX NAME",
		Short: "Checkpoint a running box (it pauses briefly and runs on)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			c, err := b.Checkpoint(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), c.Name)
			return nil
		},
	}, checkpointLsCmd(), &cobra.Command{
		Use:     "rm BOX NAME...",
		Aliases: []string{"remove"},
		Short:   "Remove checkpoints of a box (those taken after one get its parent)",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			for _, n := range args[1:] {
				if err := b.RemoveCheckpoint(cmd.Context(), n); err != nil {
					return err
				}
			}
			return nil
		},
	})
	return cmd
}

func checkpointLsCmd() *cobra.Command {
	var lf listFormat
	var tree bool
	cmd := &cobra.Command{
		Use:     "ls BOX",
		Aliases: []string{"list"},
		Short:   "List a box's checkpoints (CURRENT '*': the one it was last checkpointed at or rolled back to)",
		Long: `List a box's checkpoints, oldest first; '*' marks the one the box was last
checkpointed at or rolled back to. --tree draws them as a tree. --format
json prints one JSON object per checkpoint (fields: Name, Parent, Created,
Current, StateBytes, DiskBytes, Paused); -q the names.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			list, err := b.Checkpoints()
			if err != nil {
				return err
			}
			mark := func(c airlock.CheckpointInfo) string {
				if c.Current {
					return " *"
				}
				return ""
			}
			if tree {
				nodes := make([]checkpoint.Node, len(list))
				cur := map[string]string{}
				for i, c := range list {
					nodes[i] = checkpoint.Node{Name: c.Name, Parent: c.Parent}
					cur[c.Name] = mark(c)
				}
				for _, l := range checkpoint.Draw(nodes) {
					fmt.Fprintln(cmd.OutOrStdout(), l+cur[treeName(l)])
				}
				return nil
			}
			return writeList(cmd.OutOrStdout(), lf, list, []column[airlock.CheckpointInfo]{
				{"CURRENT", func(c airlock.CheckpointInfo) string { return strings.TrimSpace(mark(c)) }},
				{"NAME", func(c airlock.CheckpointInfo) string { return c.Name }},
				{"PARENT", func(c airlock.CheckpointInfo) string { return c.Parent }},
				{"SIZE", func(c airlock.CheckpointInfo) string {
					return fmt.Sprintf("%.1f MiB", float64(c.StateBytes+c.DiskBytes)/(1<<20))
				}},
				{"CREATED", func(c airlock.CheckpointInfo) string { return humanDuration(time.Since(c.Created)) + " ago" }},
			}, 1)
		},
	}
	lf.add(cmd, "checkpoint names")
	cmd.Flags().BoolVar(&tree, "tree", false, "draw the checkpoints as a tree")
	return cmd
}

// treeName is the checkpoint name at the end of a line of checkpoint.Draw.
func treeName(line string) string {
	for i := len(line) - 1; i >= 0; i-- {
		if line[i] == ' ' {
			return line[i+1:]
		}
	}
	return line
}

func newRollbackCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rollback BOX NAME",
		Short: "Return a box to one of its checkpoints, in place",
		Long: `Return BOX to its checkpoint NAME: its VM is ended and started again from the
checkpoint's memory, devices and writable layer, so its processes, files and
memory are as they were then (the clock is stepped to now, the RNG reseeded).
The box keeps its id, name, published ports, network policy and secrets.
Commands running in it end with an error; open connections are cut. A
stopped box is started at the checkpoint.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			return b.Rollback(cmd.Context(), args[1])
		},
	}
}
