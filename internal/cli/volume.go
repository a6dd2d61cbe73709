package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

func init() { extraCommands = append(extraCommands, newVolumeCmd) }

func newVolumeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Manage named volumes (ext4 images kept across boxes)",
		Long: `Named volumes hold data across boxes: attach one with -v NAME:BOXDIR on run or
create (a missing one is created, 1024 MiB). Each is an ext4 image of a fixed
size (filling it gives ENOSPC in the box), attached to one running box at a
time, and kept when boxes are removed.`,
	}
	var size int
	create := &cobra.Command{
		Use:   "create [--size MIB] NAME",
		Short: "Create a named volume",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			vi, err := r.CreateVolume(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), vi.Name)
			return nil
		},
	}
	create.Flags().IntVar(&size, "size", 0, "size in MiB (default 1024)")
	var volFormat listFormat
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List named volumes",
		Long: `List named volumes. --format json prints one JSON object per volume; a Go
template one line each (fields: Name, SizeMiB, Created, UsedBy); -q the names.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			vols, err := r.Volumes(cmd.Context())
			if err != nil {
				return err
			}
			return writeList(cmd.OutOrStdout(), volFormat, vols, []column[airlock.VolumeInfo]{
				{"NAME", func(v airlock.VolumeInfo) string { return v.Name }},
				{"SIZE", func(v airlock.VolumeInfo) string { return fmt.Sprintf("%d MiB", v.SizeMiB) }},
				{"CREATED", func(v airlock.VolumeInfo) string { return humanDuration(time.Since(v.Created)) + " ago" }},
				{"USED BY", func(v airlock.VolumeInfo) string { return strings.Join(v.UsedBy, ",") }},
			})
		},
	}
	volFormat.add(ls, "volume names")
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove named volumes and their data (refused while a box attaches them)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachName(cmd, args, func(ctx context.Context, r *airlock.Runtime, n string) error { return r.RemoveVolume(ctx, n) })
		},
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}
