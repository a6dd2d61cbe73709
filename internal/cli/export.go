package cli

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

func init() {
	extraCommands = append(extraCommands, newExportCmd, newCommitCmd)
}

func newExportCmd() *cobra.Command {
	var out, snapshot string
	var memory, checkpoints bool
	cmd := &cobra.Command{
		Use:   "export BOX -o FILE | export --snapshot NAME -o FILE",
		Short: "Write a box (configuration, writable layer, optionally memory) to a tar archive",
		Long: `Write BOX to a tar archive: its configuration and writable layer (what it
changed in its image; volumes are not included). With --with-memory the
running box is snapshotted (paused briefly; it runs on) and its memory goes
in too; --with-checkpoints puts the box's checkpoints in (each whole, with
their tree: the imported box can roll back to them; not with --with-memory);
--snapshot NAME exports an existing snapshot instead of a box.
'airlock import FILE' makes a box of the archive here or on another host
that has the same image (with memory: also the same guest kernel, agent and
QEMU; the boot disks are compared by content). -o - writes to standard output.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if snapshot != "" && checkpoints {
				return usagef(cmd, "export: --with-checkpoints exports a box's checkpoints, not a snapshot's")
			}
			if snapshot != "" {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usagef(cmd, "export: missing -o FILE: name the archive (or -o - for standard output)")
			}
			var w io.Writer = cmd.OutOrStdout()
			var f *os.File
			if out == "-" && isTerminal(w) {
				return fmt.Errorf("refusing to write an archive to a terminal: give a file with -o FILE, or redirect the output")
			}
			if out != "-" {
				var err error
				if f, err = os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-"); err != nil {
					return err
				}
				defer os.Remove(f.Name())
				defer f.Close()
				w = f
			}
			bw := bufio.NewWriterSize(w, 1<<20)
			t0 := time.Now()
			var st airlock.ExportStats
			if snapshot != "" {
				r, err := openRuntime(cmd)
				if err != nil {
					return err
				}
				defer r.Close()
				if st, err = r.ExportSnapshot(cmd.Context(), snapshot, bw); err != nil {
					return err
				}
			} else {
				r, b, err := openBox(cmd, args[0])
				if err != nil {
					return err
				}
				defer r.Close()
				if st, err = b.Export(cmd.Context(), bw, airlock.ExportOptions{Memory: memory, Checkpoints: checkpoints}); err != nil {
					return err
				}
			}
			if err := bw.Flush(); err != nil {
				return err
			}
			if f != nil {
				if err := f.Sync(); err != nil {
					return err
				}
				if err := os.Rename(f.Name(), out); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "exported %s: %d MiB (disk data %d MiB, memory %d MiB) in %s\n", out,
					st.Bytes>>20, st.DiskBytes>>20, st.StateBytes>>20, time.Since(t0).Round(time.Millisecond))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "archive to write (- for standard output)")
	cmd.Flags().BoolVar(&memory, "with-memory", false, "include a memory snapshot of the running box")
	cmd.Flags().BoolVar(&checkpoints, "with-checkpoints", false, "include the box's checkpoints (not with --with-memory)")
	cmd.Flags().StringVar(&snapshot, "snapshot", "", "export this snapshot (with memory) instead of a box")
	cmd.ValidArgsFunction = completeFirstBox(nil)
	cmd.RegisterFlagCompletionFunc("snapshot", completeSnapshots)
	return cmd
}

// boxImport are the flags of 'airlock import' for box archives.
type boxImport struct{ name, snapshot string }

func (bi *boxImport) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&bi.name, "name", "", "box archive: name the new box")
	cmd.Flags().StringVar(&bi.snapshot, "snapshot", "", "box archive with memory: store it as this snapshot")
}

// boxImportHelp is what 'airlock import' says of box archives.
const boxImportHelp = `

PATH may also be a box archive written by 'airlock export' (- reads one from
standard input): import then makes a box of it and prints its id. The
archive's image (same digest) must be in the image store. Without memory the
box is created stopped ('airlock start' boots it with its files); with memory
the archive is stored as a snapshot (kept; 'airlock snapshot rm' removes it)
and the box restored from it, running: on another host too, when its guest
kernel, agent disk and the image's root filesystem base have the same content
(they are built reproducibly) and its QEMU the same version and machine
layout; otherwise it refuses saying which differs. Published ports, volumes and allowed
host ports are not carried. Import archives with memory only from hosts you
trust: QEMU loads their device state.`

// importBoxArchive imports path as a box archive when it is one (its
// first entry is airlock-box.json, or path is -); ok is false otherwise.
func importBoxArchive(cmd *cobra.Command, path string, bi boxImport) (ok bool, err error) {
	var rd io.Reader = cmd.InOrStdin()
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return false, nil // the image import says why
		}
		defer f.Close()
		if !airlock.IsBoxArchive(f) {
			return false, nil
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return true, err
		}
		rd = f
	}
	r, err := openRuntime(cmd)
	if err != nil {
		return true, err
	}
	defer r.Close()
	res, err := r.ImportBox(cmd.Context(), bufio.NewReaderSize(rd, 1<<20), airlock.ImportOptions{Name: bi.name, Snapshot: bi.snapshot})
	if err != nil {
		return true, err
	}
	if res.Snapshot != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "restored from snapshot %s (kept)\n", res.Snapshot)
	}
	fmt.Fprintln(cmd.OutOrStdout(), res.Box.ID())
	return true, nil
}

func newCommitCmd() *cobra.Command {
	var comment string
	cmd := &cobra.Command{
		Use:   "commit BOX IMAGE[:TAG]",
		Short: "Make a new image of a box's image plus its writable layer",
		Long: `Store BOX's writable layer (files it added, changed and deleted) as a new
OCI layer on top of its image, named IMAGE[:TAG]: 'airlock run IMAGE:TAG'
starts from it and 'airlock images' lists it. A running box is flushed
(sync) and paused while its disk is copied. Volumes are not included, nor
extended attributes but user.* and security.*; device nodes, fifos and
sockets are left out.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			t0 := time.Now()
			res, err := b.Commit(cmd.Context(), args[1], airlock.CommitOptions{Comment: comment})
			if err != nil {
				return err
			}
			for _, s := range res.Skipped {
				fmt.Fprintf(cmd.ErrOrStderr(), "left out: %s\n", s)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "committed %d entries (%d whiteouts, %d KiB) in %s\n", res.Entries, res.Whiteouts,
				res.Bytes>>10, time.Since(t0).Round(time.Millisecond))
			fmt.Fprintln(cmd.OutOrStdout(), res.Image.Digest)
			return nil
		},
	}
	cmd.Flags().StringVarP(&comment, "message", "m", "", "comment for the new layer's history")
	cmd.ValidArgsFunction = completeFirstBox(nil)
	return cmd
}
