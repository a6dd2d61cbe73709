package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/airlock-run/airlock/codebox"
)

// Where `ask --file` puts the files in the box, and the directory whose
// files come back with --out.
const (
	askInDir  = "/data"
	askOutDir = "/out"
)

// askTask adds to the task where its files are and where output goes.
func askTask(task string, files []string, outDir string) string {
	if len(files) == 0 && outDir == "" {
		return task
	}
	var b strings.Builder
	b.WriteString(task)
	if len(files) > 0 {
		b.WriteString("\n\nInput files, already in the sandbox:")
		for _, f := range files {
			fmt.Fprintf(&b, " %s/%s", askInDir, filepath.Base(f))
		}
		b.WriteString(".")
	}
	if outDir != "" {
		fmt.Fprintf(&b, "\nSave any files you produce (results, charts) under %s/ in the sandbox; they are returned to the user.", askOutDir)
	}
	return b.String()
}

// askCopyIn prepares the box: the input files in /data, an empty /out.
func askCopyIn(ctx context.Context, cb *codebox.CodeBox, files []string) error {
	for _, d := range []string{askInDir, askOutDir} {
		if err := cb.Box().MkdirAll(ctx, d, 0o777); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := cb.CopyIn(ctx, f, askInDir+"/"); err != nil {
			return fmt.Errorf("--file %s: %w", f, err)
		}
	}
	return nil
}

// askCopyOut brings /out's files back into outDir and prints their paths.
func askCopyOut(ctx context.Context, stdout io.Writer, cb *codebox.CodeBox, outDir string) error {
	ents, err := cb.Box().ReadDir(ctx, askOutDir)
	if err != nil || len(ents) == 0 {
		return err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	if err := cb.CopyOut(ctx, askOutDir+"/.", outDir); err != nil {
		return err
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintln(stdout, "file:", filepath.Join(outDir, n))
	}
	return nil
}
