package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

func newLsCmd() *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"ps"},
		Short:   "List boxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			boxes, err := r.List(cmd.Context())
			if err != nil {
				return err
			}
			if quiet {
				for _, b := range boxes {
					fmt.Fprintln(cmd.OutOrStdout(), b.ID)
				}
				return nil
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 3, ' ', 0)
			fmt.Fprintln(w, "BOX ID\tNAME\tIMAGE\tSTATE\tCPUS\tMEMORY\tCREATED")
			for _, b := range boxes {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d MiB\t%s ago\n", b.ID, b.Name, b.Image, b.State,
					b.Options.CPUs, b.Options.MemoryMiB, time.Since(b.Created).Round(time.Second))
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "only print box ids")
	// Docker's ps -a: airlock ls always lists stopped boxes too.
	cmd.Flags().BoolP("all", "a", false, "list all boxes (the default: stopped ones are always listed)")
	return cmd
}

// eachBox runs f on every named box, reporting errors per box like Docker.
func eachBox(cmd *cobra.Command, names []string, f func(ctx context.Context, r *airlock.Runtime, b *airlock.Box) error) error {
	r, err := openRuntime(cmd)
	if err != nil {
		return err
	}
	defer r.Close()
	failed := false
	for _, n := range names {
		b, err := r.Get(cmd.Context(), n)
		if err == nil {
			err = f(cmd.Context(), r, b)
		}
		if err != nil {
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
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachBox(cmd, args, func(ctx context.Context, _ *airlock.Runtime, b *airlock.Box) error { return b.Start(ctx) })
		},
	}
}

func newStopCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stop BOX...",
		Short: "Stop running boxes (shut down cleanly, then force)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachBox(cmd, args, func(ctx context.Context, _ *airlock.Runtime, b *airlock.Box) error { return b.Stop(ctx) })
		},
	}
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

func newLogsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "logs BOX",
		Short: "Print a box's console log (guest kernel and agent messages)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			b, err := r.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			f, err := os.Open(b.ConsoleLog())
			if err != nil {
				return fmt.Errorf("box %s has no console log yet: %w", b.ID(), err)
			}
			defer f.Close()
			// Escaped: the guest writes this log, and a terminal must not
			// obey its control sequences.
			return airlock.CopyConsole(cmd.OutOrStdout(), f)
		},
	}
}
