package codebox

import (
	"context"
	"errors"
	"fmt"
)

// Rollback rolls the CodeBox's box back, in place, to its checkpoint name
// (airlock.Box.Rollback; take one with c.Box().Checkpoint) and reattaches
// each context to its interpreter as it was at the checkpoint: its
// variables, imports and functions are the checkpoint's, together with
// the box's files and processes (an agent's "undo"). A context whose
// interpreter was started after the checkpoint had none then: its next
// Run starts a fresh one. Rollback waits for cells that are running; on
// error the contexts' next Run starts fresh interpreters.
func (c *CodeBox) Rollback(ctx context.Context, name string) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errors.New("codebox: closed")
	}
	ctxs := make([]*Context, 0, len(c.contexts))
	for k := range c.contexts {
		ctxs = append(ctxs, k)
	}
	c.mu.Unlock()
	dirs := map[*Context]string{}
	for _, x := range ctxs {
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.k != nil {
			if dp, ok := x.k.p.(*daemonProc); ok {
				dirs[x] = dp.dir
			}
		}
		// Its relay ends with the box's machine; the interpreter itself
		// must not be killed: the checkpoint's lives on after the rollback.
		x.k = nil
	}
	if err := c.box.Rollback(ctx, name); err != nil {
		return fmt.Errorf("codebox: %w", err)
	}
	for x, dir := range dirs {
		if k, err := attachKernel(ctx, c.box, dir); err == nil {
			x.k = k
		}
	}
	return nil
}
