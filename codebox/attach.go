package codebox

import (
	"github.com/airlock-run/airlock"
)

// Attach makes a CodeBox of an existing box b, which must have Python (see
// Options; opts.BoxOptions is ignored: the box already exists). The box's
// lifetime stays with its owner: Close on an attached CodeBox closes its
// contexts but neither stops nor removes the box. Used by airlock serve,
// where boxes are created and removed through their own calls.
func Attach(b *airlock.Box, opts Options) *CodeBox {
	if opts.Python == "" {
		opts.Python = DefaultPython
	}
	killGrace := opts.InterruptGrace
	if opts.InterruptGrace <= 0 {
		opts.InterruptGrace = DefaultInterruptGrace
	}
	return &CodeBox{box: b, opts: opts, killGrace: killGrace, contexts: map[*Context]struct{}{}, attached: true}
}
