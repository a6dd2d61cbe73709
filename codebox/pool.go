package codebox

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/friend"
)

// warmDir is the directory (under kernelRunDir) of the interpreter
// daemon a Pool launches in each of its boxes; templateDir that of the
// one it starts and stops in its template box.
const (
	warmDir     = kernelRunDir + "/warm"
	templateDir = kernelRunDir + "/template"
)

// Pool returns the options of a warm pool (airlock.Options.Pool) of size
// boxes for CodeBoxes of opts, as New makes them (opts.BoxOptions, the
// default image when empty). Each pool box has a context interpreter
// already started, the kernel script imported and idle: the first
// NewContext of a CodeBox that New took from this pool (or of Attach on
// such a box, in the same process) adopts it, so its first Run costs a
// round trip to a running interpreter, not an interpreter start. The
// interpreter is a context's daemon (as NewContext starts it) that each
// pool box starts once it is restored, before it can be claimed: every
// pool box has its own interpreter, with its own str hash seed
// (PYTHONHASHSEED) and random state. The pool's template box starts one
// and stops it before the snapshot, so that Python's files are in the
// restored guests' page cache.
//
// The pool serves airlock.Runtime.Create as well: boxes with the same
// options come from it, each with that idle interpreter running. An image
// without the interpreter gives a pool of plain boxes.
func Pool(opts Options, size int) airlock.PoolOptions {
	bo := opts.BoxOptions
	if bo.Image == "" {
		bo.Image = airlock.DefaultImage
	}
	python := opts.Python
	if python == "" {
		python = DefaultPython
	}
	po := airlock.PoolOptions{
		BoxOptions: bo,
		Size:       size,
		Prepare: func(ctx context.Context, b *airlock.Box) error {
			// An interpreter that every restored box shared would share
			// its hash seed: this one only reads Python's files into the
			// page cache the snapshot keeps, and goes.
			err := launchKernel(ctx, b, python, templateDir, ContextOptions{})
			if errors.Is(err, errNoPython) {
				return nil // no Python in the image: the pool's boxes are plain boxes
			}
			if err != nil {
				return fmt.Errorf("start a Python kernel: %w", err)
			}
			if res, err := b.Exec(ctx, "sh", []string{"-c", signalScript, "signal", templateDir, "KILL"}, airlock.ExecOptions{}); err != nil || res.ExitCode != 0 {
				return fmt.Errorf("stop the template's Python kernel: %v %v", res, err)
			}
			return nil
		},
	}
	// Each box's own interpreter, started while the box waits in the
	// pool (internal/friend: no public API): a claim costs none of it.
	friend.PoolWarm(&po, func(ctx context.Context, box any) (any, error) {
		b := box.(*airlock.Box)
		err := launchKernel(ctx, b, python, warmDir, ContextOptions{})
		if errors.Is(err, errNoPython) {
			return nil, nil // no Python in the image: a plain box
		}
		if err != nil {
			return nil, fmt.Errorf("start the pool box's Python kernel: %w", err)
		}
		k, err := attachKernel(ctx, b, warmDir)
		if err != nil {
			return nil, fmt.Errorf("attach the pool's Python kernel: %w", err)
		}
		return &warmKernel{k: k, python: python}, nil
	})
	return po
}

// warmKernel is a pool box's interpreter, started and attached (Warm),
// for the first context of the CodeBox that claims the box.
type warmKernel struct {
	k      *kernel
	python string // the interpreter it runs (Options.Python)
}

// takeWarm returns, once, the interpreter running in a box taken from a
// codebox pool, for a context with default options co and the same
// interpreter; nil otherwise (a kernel not taken stays idle in the box).
func (c *CodeBox) takeWarm(co ContextOptions) *kernel {
	if co.WorkingDir != "" || len(co.Env) > 0 {
		return nil
	}
	if wk, ok := friend.TakeWarm(c.box).(*warmKernel); ok {
		if wk.python == c.opts.Python {
			return wk.k
		}
		wk.k.kill()
	}
	return nil
}
