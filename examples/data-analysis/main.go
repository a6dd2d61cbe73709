// Command data-analysis is the seed's data-analysis agent step: a CSV goes
// into a box, pandas summarises it and matplotlib draws a chart there, and
// the chart comes back. No code runs on this machine but the copy.
//
//	go run ./examples/data-analysis [data.csv [outdir]]
//
// Without a CSV it writes a small sample one. It needs the
// airlock/python-data image (numpy, pandas, matplotlib), which
// hack/setup.sh builds. With a model, `airlock ask --image
// airlock/python-data --file data.csv --out outdir "chart the sales"` does
// the same with code the model writes.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
)

const sample = `month,region,sales
2026-01,north,120
2026-01,south,95
2026-02,north,132
2026-02,south,101
2026-03,north,128
2026-03,south,117
2026-04,north,151
2026-04,south,124
`

const analysis = `
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

df = pd.read_csv("/data/data.csv")
print(df.describe(include="all").to_string())
pivot = df.pivot_table(index=df.columns[0], columns=df.columns[1], values=df.columns[-1], aggfunc="sum")
print()
print(pivot.to_string())
ax = pivot.plot(marker="o", title="%s by %s" % (df.columns[-1], df.columns[1]))
ax.set_ylabel(df.columns[-1])
plt.tight_layout()
plt.savefig("/out/chart.png", dpi=100)
print("\nchart: /out/chart.png")
`

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "data-analysis:", err)
		os.Exit(1)
	}
}

func run() error {
	csv, outDir := "", "out"
	if len(os.Args) > 1 {
		csv = os.Args[1]
	}
	if len(os.Args) > 2 {
		outDir = os.Args[2]
	}
	if csv == "" {
		dir, err := os.MkdirTemp("", "data-analysis-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		csv = filepath.Join(dir, "data.csv")
		if err := os.WriteFile(csv, []byte(sample), 0o644); err != nil {
			return err
		}
	}
	ctx := context.Background()
	rt, err := airlock.Open(airlock.Options{})
	if err != nil {
		return err
	}
	defer rt.Close()
	cb, err := codebox.New(ctx, rt, codebox.Options{
		BoxOptions: airlock.BoxOptions{Image: "airlock/python-data", MemoryMiB: 1024, Network: airlock.NetworkDisabled},
		Timeout:    2 * time.Minute,
	})
	if err != nil {
		return fmt.Errorf("sandbox failed to start: %w", err)
	}
	defer cb.Close()

	// In: the CSV as /data/data.csv.
	data, err := os.ReadFile(csv)
	if err != nil {
		return err
	}
	if err := cb.WriteFile(ctx, "/data/data.csv", data, 0o644); err != nil {
		return err
	}
	if err := cb.Box().MkdirAll(ctx, "/out", 0o755); err != nil {
		return err
	}
	// The analysis, in the box.
	out, err := cb.Run(ctx, analysis)
	fmt.Print(out)
	if err != nil {
		return err
	}
	// Out: the chart.
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	if err := cb.CopyOut(ctx, "/out/chart.png", outDir); err != nil {
		return err
	}
	fmt.Println("saved", filepath.Join(outDir, "chart.png"))
	return nil
}
