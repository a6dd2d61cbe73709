package codebox

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlock-run/airlock"
)

// ID returns the context's id: the same in the children of a
// CodeBox.Fork, where CodeBox.Context finds it.
func (x *Context) ID() string { return x.id }

// Context returns the context with id (Context.ID) of c, nil if none:
// after Fork, each child has the parent's contexts under their ids.
func (c *CodeBox) Context(id string) *Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.contexts {
		if k.id == id {
			return k
		}
	}
	return nil
}

// Fork forks the CodeBox's box into n children (airlock.Box.Fork: the box
// is paused while it is snapshotted) and returns a CodeBox for each, with
// the parent's contexts under the same ids (CodeBox.Context): each
// child's context is the parent's interpreter as it was at the fork, its
// variables, imports and functions included, running on independently
// (its random module reseeded, as after os.fork). Fork waits for cells
// that are running. The children of a CodeBox made by New are not
// attached: Close removes each child's box, and, as for New, the next
// airlock.Open removes it once this program is gone. Those of one made by
// Attach are attached, as it is: their boxes are whoever manages c's box's
// to remove (Close ends only their contexts). On error no child is left.
func (c *CodeBox) Fork(ctx context.Context, n int) ([]*CodeBox, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("codebox: closed")
	}
	ctxs := make([]*Context, 0, len(c.contexts))
	for k := range c.contexts {
		ctxs = append(ctxs, k)
	}
	c.mu.Unlock()
	// No cell runs while the box is snapshotted: nothing is in flight in
	// an interpreter's FIFOs.
	type state struct {
		x      *Context
		dir    string
		nextID int64
	}
	var states []state
	for _, x := range ctxs {
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.closed {
			continue
		}
		s := state{x: x, nextID: x.nextID}
		if x.k != nil {
			dp, ok := x.k.p.(*daemonProc)
			if !ok {
				return nil, fmt.Errorf("codebox: context %s has no interpreter daemon to fork", x.id)
			}
			s.dir = dp.dir
		}
		states = append(states, s)
	}
	// Like New's boxes, the children go with this program (unless the
	// CodeBox was attached to a box someone else manages).
	kids, err := c.box.Fork(ctx, n, airlock.ForkOptions{AutoRemove: !c.attached})
	if err != nil {
		return nil, fmt.Errorf("codebox: %w", err)
	}
	out := make([]*CodeBox, len(kids))
	fail := func(err error) ([]*CodeBox, error) {
		for i, k := range kids {
			if out[i] != nil {
				out[i].Close() // its contexts (and, unattached, its box)
			}
			k.Remove(context.WithoutCancel(ctx), true)
		}
		return nil, err
	}
	for i, kb := range kids {
		child := &CodeBox{box: kb, opts: c.opts, killGrace: c.killGrace, contexts: map[*Context]struct{}{}, attached: c.attached}
		out[i] = child
		for _, s := range states {
			x := child.newContextValue(s.x.id, s.x.co)
			x.nextID = s.nextID
			if s.dir != "" {
				k, err := attachKernel(ctx, kb, s.dir)
				if err != nil {
					return fail(fmt.Errorf("codebox: reattach context %s in fork child %s: %w", s.x.id, kb.ID(), err))
				}
				x.k = k
			}
			child.contexts[x] = struct{}{}
		}
	}
	return out, nil
}
