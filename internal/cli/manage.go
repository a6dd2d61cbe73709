package cli

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/sparse"
)

func init() {
	extraCommands = append(extraCommands, newRenameCmd, newPruneCmd, newSystemCmd, newStatsCmd, newTopCmd)
}

func newRenameCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rename BOX NEW_NAME",
		Short: "Rename a box",
		Long: `Give BOX the name NEW_NAME (unique among the boxes of this home). A running
box keeps its host name until it is started again.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			return b.Rename(cmd.Context(), args[1])
		},
	}
}

func newPruneCmd() *cobra.Command {
	var force, all bool
	cmd := &cobra.Command{
		Use:   "prune [-f] [-a]",
		Short: "Remove stopped boxes (-a: and images no box uses)",
		Long: `Remove every box that is not running (its writable layer and record), and
with -a every image no box uses (with its root filesystem base), then say how
much space that freed. On a terminal it asks first; elsewhere it needs -f.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !force {
				f, ok := cmd.InOrStdin().(*os.File)
				if !ok || !term.IsTerminal(int(f.Fd())) {
					return usagef(cmd, "prune: removes every stopped box%s; add -f to confirm", map[bool]string{true: " and unused image", false: ""}[all])
				}
				what := "all stopped boxes"
				if all {
					what += " and every image no box uses"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "This removes %s. Continue? [y/N] ", what)
				line, _ := bufio.NewReader(f).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
					return &ExitError{1}
				}
			}
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			boxes, err := r.List(ctx)
			if err != nil {
				return err
			}
			var freed int64
			failed := false
			header := false
			for _, info := range boxes {
				if info.State == airlock.BoxRunning {
					continue
				}
				b, err := r.Get(ctx, info.ID)
				if err != nil {
					continue
				}
				size := sparse.AllocatedTree(boxDir(b))
				if err := b.Remove(ctx, false); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "airlock:", err)
					failed = true
					continue
				}
				if !header {
					fmt.Fprintln(out, "Deleted boxes:")
					header = true
				}
				fmt.Fprintln(out, info.ID)
				freed += size
			}
			if all {
				var imgs []*image.Image
				if s, err := openImages(); err == nil {
					imgs, _ = s.List()
				}
				seen := map[string]bool{}
				for _, img := range imgs {
					if seen[img.Digest] {
						continue
					}
					seen[img.Digest] = true
					if users, err := r.ImageInUse(ctx, img.Digest); err != nil || len(users) > 0 {
						continue
					}
					size := img.Size
					if fi, err := os.Stat(rootfs.BasePath(defaults.Cache(), img.Digest)); err == nil {
						size += fi.Sys().(*syscall.Stat_t).Blocks * 512
					}
					if err := removeImage(cmd, r, img.Digest, false); err != nil {
						fmt.Fprintln(cmd.ErrOrStderr(), "airlock:", err)
						failed = true
						continue
					}
					freed += size
				}
			}
			fmt.Fprintf(out, "Total reclaimed space: %s\n", humanize.Bytes(uint64(freed)))
			if failed {
				return &ExitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "do not ask for confirmation")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "also remove images no box uses, and their root filesystem bases")
	return cmd
}

func newSystemCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "system",
		Short: "Disk usage and cleanup (system df, system prune)",
	}
	df := &cobra.Command{
		Use:   "df",
		Short: "Show the disk space images, boxes, snapshots and caches take",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			ctx := cmd.Context()
			type row struct {
				Type              string
				Total, Active     int
				Size, Reclaimable int64 // bytes
			}
			var rows []row
			var imgs []*image.Image
			if s, err := openImages(); err == nil {
				imgs, _ = s.List()
			}
			ir := row{Type: "Images"}
			seen := map[string]bool{}
			for _, img := range imgs {
				if seen[img.Digest] {
					continue
				}
				seen[img.Digest] = true
				ir.Total++
				ir.Size += img.Size
				if users, _ := r.ImageInUse(ctx, img.Digest); len(users) > 0 {
					ir.Active++
				} else {
					ir.Reclaimable += img.Size
				}
			}
			boxes, err := r.List(ctx)
			if err != nil {
				return err
			}
			br := row{Type: "Boxes"}
			for _, info := range boxes {
				b, err := r.Get(ctx, info.ID)
				if err != nil {
					continue
				}
				size := sparse.AllocatedTree(boxDir(b))
				br.Total++
				br.Size += size
				if info.State == airlock.BoxRunning {
					br.Active++
				} else {
					br.Reclaimable += size
				}
			}
			// Warm-pool boxes (airlock serve --pool) are not listed:
			// they are nobody's until a create takes one.
			pbs, err := r.PoolBoxes(ctx)
			if err != nil {
				return err
			}
			pr := row{Type: "Pool boxes"}
			pbSize := make([]int64, len(pbs))
			for i, pb := range pbs {
				pbSize[i] = sparse.AllocatedTree(pb.Dir)
				pr.Total++
				pr.Size += pbSize[i]
				if pb.State == airlock.BoxRunning {
					pr.Active++
				}
			}
			// Snapshots outlive their box and prune: none is in use (a
			// restored box has its own copy), all are removable with
			// 'airlock snapshot rm'.
			snaps, err := r.Snapshots(ctx)
			if err != nil {
				return err
			}
			sr := row{Type: "Snapshots"}
			for _, sn := range snaps {
				size := sparse.AllocatedTree(sn.Dir)
				sr.Total++
				sr.Size += size
				sr.Reclaimable += size
			}
			cache := defaults.Cache()
			cr := row{Type: "Cache (kernels, bases)", Size: sparse.AllocatedTree(cache)}
			rows = append(rows, ir, br, pr, sr, cr)
			err = writeList(cmd.OutOrStdout(), listFmt, rows, []column[row]{
				{"TYPE", func(r row) string { return r.Type }},
				{"TOTAL", func(r row) string { return countOrDash(r.Total, r.Type) }},
				{"ACTIVE", func(r row) string { return countOrDash(r.Active, r.Type) }},
				{"SIZE", func(r row) string { return humanize.Bytes(uint64(r.Size)) }},
				{"RECLAIMABLE", func(r row) string { return humanize.Bytes(uint64(r.Reclaimable)) }},
			})
			if err != nil || !dfVerbose || listFmt.format != "" || len(pbs) == 0 {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout())
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "POOL BOX\tIMAGE\tSTATE\tPOOL\tHELD BY PID\tSIZE")
			for i, pb := range pbs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", pb.ID, pb.Image, pb.State, pb.Pool, pb.OwnerPID, humanize.Bytes(uint64(pbSize[i])))
			}
			return tw.Flush()
		},
	}
	df.Flags().StringVar(&listFmt.format, "format", "", "json (one object per line) or a Go template such as '{{.Type}} {{.Size}}'")
	df.Flags().BoolVarP(&dfVerbose, "verbose", "v", false, "also list the warm-pool boxes (airlock serve --pool), which ls does not show")
	prune := newPruneCmd()
	cmd.AddCommand(df, prune)
	return cmd
}

// listFmt is system df's --format; dfVerbose its -v.
var (
	listFmt   listFormat
	dfVerbose bool
)

func countOrDash(n int, typ string) string {
	if strings.HasPrefix(typ, "Cache") {
		return "-"
	}
	return strconv.Itoa(n)
}

// statsRow is one box in airlock stats.
type statsRow struct {
	ID, Name   string
	CPUPercent float64 // of one host CPU, over the sample
	MemUsage   int64   // bytes: QEMU's resident memory (guest RAM touched + QEMU)
	MemLimit   int64   // bytes: the box's guest memory
	Disk       int64   // bytes the writable layer holds on the host
	PIDs       int     `json:",omitempty"`
}

func newStatsCmd() *cobra.Command {
	var noStream bool
	var lf listFormat
	cmd := &cobra.Command{
		Use:   "stats [flags] [BOX...]",
		Short: "Show CPU, memory and disk use of running boxes",
		Long: `Show, for each running box (or the ones named), the CPU its VM used (percent
of one host CPU), its memory (QEMU's resident memory against the box's guest
memory) and its disk (what its writable layer holds on the host). Refreshes
every 2 s until Ctrl-C; --no-stream prints one sample (taken over 0.5 s).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			ctx := cmd.Context()
			pick := func() ([]*airlock.Box, error) {
				var out []*airlock.Box
				if len(args) > 0 {
					for _, n := range args {
						b, err := r.Get(ctx, n)
						if err != nil {
							return nil, err
						}
						out = append(out, b)
					}
					return out, nil
				}
				infos, err := r.List(ctx)
				if err != nil {
					return nil, err
				}
				for _, i := range infos {
					if i.State == airlock.BoxRunning {
						if b, err := r.Get(ctx, i.ID); err == nil {
							out = append(out, b)
						}
					}
				}
				return out, nil
			}
			interval := 2 * time.Second
			if noStream {
				interval = 500 * time.Millisecond
			}
			w := cmd.OutOrStdout()
			tty := false
			if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				tty = true
			}
			// Each box's figures are the library's (Box.Stats, as GET
			// /v1/boxes/{id}/stats serves them); CPU is the rate between
			// two readings.
			prev := map[string]airlock.BoxStats{}
			for first := true; ; first = false {
				boxes, err := pick()
				if err != nil {
					return err
				}
				if first {
					for _, b := range boxes {
						if st, err := b.Stats(ctx); err == nil {
							prev[b.ID()] = st
						}
					}
					select {
					case <-ctx.Done():
						return nil
					case <-time.After(interval):
					}
				}
				var rows []statsRow
				for _, b := range boxes {
					st, err := b.Stats(ctx)
					if err != nil {
						continue // stopped (or gone) meanwhile
					}
					row := statsRow{ID: b.ID(), Name: b.Name(), MemUsage: st.MemoryBytes, MemLimit: st.MemoryLimitBytes, Disk: st.DiskBytes}
					if p, ok := prev[b.ID()]; ok {
						row.CPUPercent = st.CPUPercent(p)
					}
					prev[b.ID()] = st
					rows = append(rows, row)
				}
				if tty && !noStream && lf.format == "" {
					fmt.Fprint(w, "\033[2J\033[H")
				}
				err = writeList(w, lf, rows, []column[statsRow]{
					{"BOX ID", func(r statsRow) string { return r.ID }},
					{"NAME", func(r statsRow) string { return r.Name }},
					{"CPU %", func(r statsRow) string { return fmt.Sprintf("%.2f%%", r.CPUPercent) }},
					{"MEM USAGE / LIMIT", func(r statsRow) string {
						return humanize.IBytes(uint64(r.MemUsage)) + " / " + humanize.IBytes(uint64(r.MemLimit))
					}},
					{"DISK", func(r statsRow) string { return humanize.IBytes(uint64(r.Disk)) }},
				})
				if err != nil || noStream {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	cmd.Flags().BoolVar(&noStream, "no-stream", false, "print one sample and exit")
	cmd.Flags().StringVar(&lf.format, "format", "", "json (one object per line) or a Go template such as '{{.Name}} {{.CPUPercent}}'")
	return cmd
}

func newTopCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "top BOX [ps OPTIONS]",
		Short: "Show the processes running in a box",
		Long: `Run ps in the running box BOX (default options: -ef) and print what it shows.
The image needs a ps (procps or busybox).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			psArgs := args[1:]
			if len(psArgs) == 0 {
				psArgs = []string{"-ef"}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			res, err := b.Exec(ctx, "ps", psArgs, airlock.ExecOptions{User: "0"})
			if err != nil {
				return err
			}
			if res.ExitCode == 127 {
				return fmt.Errorf("box %s has no ps: its image needs procps or busybox for airlock top", b.ID())
			}
			// Process names and arguments are the box's: escaped on a terminal.
			out, flushOut := terminalSafe(cmd.OutOrStdout())
			errw, flushErr := terminalSafe(cmd.ErrOrStderr())
			out.Write(res.Stdout)
			errw.Write(res.Stderr)
			flushOut()
			flushErr()
			if res.ExitCode != 0 {
				return &ExitError{res.ExitCode}
			}
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false)
	return cmd
}
