package codebox

import (
	"context"
	"io/fs"
)

// ContextOptions tune a Context (CodeBox.NewContext).
type ContextOptions struct {
	// WorkingDir is the interpreter's working directory in the box
	// (default: the box's); it must exist (see CodeBox.CopyIn, MkdirAll).
	WorkingDir string
	// Env is added to the interpreter's environment (KEY=VALUE).
	Env []string
	// Structured asks for the structured forms E2B's code interpreter
	// gives besides the rendered ones: a pandas DataFrame's columns
	// (MIMEData in its Display.Data or Result.ValueData, for frames of up
	// to 200000 cells and 4 MiB of JSON) and a matplotlib figure's chart
	// (Image.Chart; MIMEChart in a bundle). It is sent with each cell, so
	// it does not keep a context from adopting a pool box's interpreter.
	Structured bool
}

// CopyIn copies a host file or directory tree into the box, with `docker
// cp` rules (see airlock.Box.CopyIn).
func (c *CodeBox) CopyIn(ctx context.Context, hostPath, boxPath string) error {
	return c.box.CopyIn(ctx, hostPath, boxPath)
}

// CopyOut copies a file or directory tree of the box to the host (see
// airlock.Box.CopyOut: nothing is written outside hostPath).
func (c *CodeBox) CopyOut(ctx context.Context, boxPath, hostPath string) error {
	return c.box.CopyOut(ctx, boxPath, hostPath)
}

// ReadFile returns a file of the box.
func (c *CodeBox) ReadFile(ctx context.Context, boxPath string) ([]byte, error) {
	return c.box.ReadFile(ctx, boxPath)
}

// WriteFile writes a file in the box atomically, creating its directory
// when missing; perm 0 means 0644.
func (c *CodeBox) WriteFile(ctx context.Context, boxPath string, data []byte, perm fs.FileMode) error {
	if err := c.box.MkdirAll(ctx, parentDir(boxPath), 0o755); err != nil {
		return err
	}
	return c.box.WriteFile(ctx, boxPath, data, perm)
}

func parentDir(p string) string {
	for i := len(p) - 1; i > 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return "/"
}
