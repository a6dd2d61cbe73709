package cli

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

// checkFromArgs refuses `run|create --from SNAP IMAGE ...`: with --from
// there is no IMAGE argument, and the snapshot's image name given out of
// habit was run as the command ("python:slim: command not found", exit
// 127, or a box whose main command failed at once).
func checkFromArgs(ctx context.Context, cmd *cobra.Command, r *airlock.Runtime, from string, rest []string) error {
	if from == "" || len(rest) == 0 {
		return nil
	}
	s, err := r.Snapshot(ctx, from)
	if err != nil {
		return nil // the restore says what is wrong
	}
	if rest[0] == s.Image || rest[0] == s.Options.Image || rest[0] == s.ImageDigest {
		return usagef(cmd, "%s: with --from, leave the image out: snapshot %s names it (%s); give only the command, e.g. airlock %s --from %s %s",
			cmd.Name(), from, s.Image, cmd.Name(), from, "sh -c 'echo hi'")
	}
	return nil
}
