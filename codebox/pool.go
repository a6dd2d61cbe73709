package codebox

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlock-run/airlock"
)

// warmDir is the directory (under kernelRunDir) of the interpreter
// daemon a Pool launches in its template box.
const warmDir = kernelRunDir + "/warm"

// Pool returns the options of a warm pool (airlock.Options.Pool) of size
// boxes for CodeBoxes of opts, as New makes them (opts.BoxOptions, the
// default image when empty). Each pool box has a context interpreter
// already started, the kernel script imported and idle: the first
// NewContext of a CodeBox that New took from this pool (or of Attach on
// such a box, in the same process) adopts it, so its first Run costs a
// round trip to a running interpreter, not an interpreter start. The
// interpreter is a context's daemon (as NewContext starts it) launched
// once in the pool's template box, before the snapshot; while a restored
// box waits in the pool it gets a relay to that daemon and reseeds its
// random module, as a CodeBox.Fork child does.
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
	return airlock.PoolOptions{
		BoxOptions: bo,
		Size:       size,
		Prepare: func(ctx context.Context, b *airlock.Box) error {
			err := launchKernel(ctx, b, python, warmDir, ContextOptions{})
			if errors.Is(err, errNoPython) {
				return nil // no Python in the image: the pool's boxes are plain boxes
			}
			if err != nil {
				return fmt.Errorf("start a Python kernel: %w", err)
			}
			return nil
		},
		Warm: func(ctx context.Context, b *airlock.Box) (any, error) {
			if res, err := b.Exec(ctx, "sh", []string{"-c", `test -p "$1"`, "sh", warmDir + "/in"}, airlock.ExecOptions{}); err != nil {
				return nil, err
			} else if res.ExitCode != 0 {
				return nil, nil // none launched (no Python in the image): a plain box
			}
			k, err := attachKernel(ctx, b, warmDir)
			if err != nil {
				return nil, fmt.Errorf("attach the pool's Python kernel: %w", err)
			}
			return &warmKernel{k: k, python: python}, nil
		},
	}
}

// warmKernel is a pool box's interpreter, attached and reseeded (Warm),
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
	if wk, ok := c.box.TakeWarm().(*warmKernel); ok {
		if wk.python == c.opts.Python {
			return wk.k
		}
		wk.k.kill()
	}
	return nil
}
