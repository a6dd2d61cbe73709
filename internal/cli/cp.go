package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

func init() { extraCommands = append(extraCommands, newCpCmd) }

// splitBoxPath splits "BOX:PATH" as `docker cp` does: an argument starting
// with "/" or "." (or without ':') is a host path.
func splitBoxPath(arg string) (box, p string, inBox bool) {
	if arg == "" || strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return "", arg, false
	}
	box, p, ok := strings.Cut(arg, ":")
	if !ok || box == "" {
		return "", arg, false
	}
	return box, p, true
}

func newCpCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cp SRC BOX:DEST | BOX:SRC DEST",
		Short: "Copy files or directory trees between the host and a running box",
		Long: `Copy a file or directory tree into or out of a running box, with
'docker cp' rules: a directory copied to a missing path is created there; to
an existing directory it goes inside it (only its contents when SRC ends in
"/."); a file replaces an existing file or goes inside an existing directory;
DEST ending in "/" must be an existing directory for a file. Modes, times,
symlinks and hard links are kept; owners are kept when copying in as root.
SRC "-" reads a tar stream from stdin and unpacks it into the directory
BOX:DEST; DEST "-" writes BOX:SRC as a tar stream to stdout. A stopped box is
started for the copy and stopped again.

Paths in the box are resolved inside it (a symlink there cannot redirect the
copy elsewhere); on the host nothing is written outside DEST, symlinks from
the box are never followed, device nodes are refused and setuid bits
cleared.`,
		Example: `  airlock cp ./data.csv scratch:/data/
  airlock cp scratch:/data/chart.png .
  tar -C src -c . | airlock cp - scratch:/src
  airlock cp scratch:/root/out - | tar -t`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sbox, spath, sIn := splitBoxPath(args[0])
			dbox, dpath, dIn := splitBoxPath(args[1])
			if sIn == dIn {
				return fmt.Errorf("airlock cp copies between the host and a box: exactly one of %q and %q must be BOX:PATH", args[0], args[1])
			}
			name := sbox
			if dIn {
				name = dbox
			}
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			ctx := cmd.Context()
			b, err := r.Get(ctx, name)
			if err != nil {
				return err
			}
			// A stopped box is started for the copy and stopped again, as
			// `docker cp` works on stopped containers.
			if info, err := b.Info(ctx); err == nil && info.State != airlock.BoxRunning {
				if err := b.Start(ctx); err != nil {
					return err
				}
				defer func() {
					cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
					defer cancel()
					if err := b.Stop(cctx); err != nil {
						fmt.Fprintln(cmd.ErrOrStderr(), "airlock:", err)
					}
				}()
			}
			switch {
			case dIn && spath == "-":
				return b.CopyInTar(ctx, dpath, cmd.InOrStdin())
			case dIn:
				err := b.CopyIn(ctx, spath, dpath)
				if dir := path.Dir(path.Clean(dpath)); errors.Is(err, fs.ErrNotExist) && dir != "/" {
					// As docker cp, a missing parent is not made; the
					// hint says how (missingDirError).
					return &missingDirError{err: err, dir: dir, box: name}
				}
				return err
			case dpath == "-":
				rc, err := b.CopyOutTar(ctx, spath)
				if err != nil {
					return err
				}
				defer rc.Close()
				_, err = io.Copy(cmd.OutOrStdout(), rc)
				return err
			default:
				return b.CopyOut(ctx, spath, dpath)
			}
		},
	}
	return cmd
}

// missingDirError is a copy into a box whose destination's parent
// directory dir is missing; its hint names the mkdir that makes it.
type missingDirError struct {
	err      error
	dir, box string
}

func (e *missingDirError) Error() string { return e.err.Error() }
func (e *missingDirError) Unwrap() error { return e.err }
