package cli

import (
	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

func init() { extraCommands = append(extraCommands, newBenchCmd) }

func newBenchCmd() *cobra.Command {
	var o airlock.BenchOptions
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure box boot and exec costs against the bare limit",
		Long: `Boot boxes and measure, with medians over --runs runs: the bare limit (the
same QEMU command line with a trivial init), box cold start (create to the
first exec of true), first python3 output, exec round trip vs the agent's own
time, and QEMU memory of an idle box vs the bare VM. With two kernels (the
airlock kernel and Debian's, when both are installed) it compares them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Log = cmd.ErrOrStderr()
			rep, err := airlock.Bench(cmd.Context(), o)
			if err != nil {
				return err
			}
			rep.Write(cmd.OutOrStdout())
			return nil
		},
	}
	cmd.Flags().IntVar(&o.Runs, "runs", 5, "runs per measurement")
	cmd.Flags().StringVar(&o.Image, "image", airlock.DefaultImage, "image to boot")
	cmd.Flags().StringArrayVar(&o.Kernels, "kernel", nil, "kernel (vmlinux) to measure, repeatable (default: the current one and Debian's)")
	return cmd
}
