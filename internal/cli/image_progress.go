package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// barsFit reports whether w is a terminal with a known width, where
// progress bars can be drawn.
func barsFit(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	cols, _, err := term.GetSize(int(f.Fd()))
	return err == nil && cols >= 40
}

// progress shows per-layer transfer progress: an mpb bar per layer (bytes,
// rate, ETA) when its writer is a terminal, else one line per finished
// layer. Its update method is an image.ProgressFunc.
type progress struct {
	w    io.Writer
	verb string // "downloaded", "imported"
	p    *mpb.Progress

	mu     sync.Mutex
	layers map[string]*layerProgress
	order  []string
}

type layerProgress struct {
	bar     *mpb.Bar
	last    time.Time
	done    int64
	total   int64
	present bool // already in the store: reported once, complete
	printed bool
}

func newProgress(ctx context.Context, w io.Writer, verb string) *progress {
	p := &progress{w: w, verb: verb, layers: map[string]*layerProgress{}}
	if barsFit(w) {
		p.p = mpb.NewWithContext(ctx, mpb.WithOutput(w), mpb.WithWidth(30), mpb.WithRefreshRate(150*time.Millisecond))
	}
	return p
}

// layerName is how a layer is shown: its first 12 hex digits, like Docker.
func layerName(digest string) string {
	h := strings.TrimPrefix(digest, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

// update receives image.ProgressFunc calls (serialized by the store).
func (p *progress) update(digest string, done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.layers[digest]
	if l == nil {
		l = &layerProgress{last: time.Now(), total: total, present: total >= 0 && done == total}
		p.layers[digest] = l
		p.order = append(p.order, digest)
		if p.p != nil {
			l.bar = p.newBar(digest, l)
		}
	}
	now := time.Now()
	if l.bar != nil {
		l.bar.EwmaSetCurrent(done, now.Sub(l.last))
	}
	l.last, l.done = now, done
	if p.p == nil && total >= 0 && done >= total && !l.printed {
		l.printed = true
		p.line(digest, l)
	}
}

func (p *progress) newBar(digest string, l *layerProgress) *mpb.Bar {
	name := decor.Name(layerName(digest), decor.WC{C: decor.DindentRight | decor.DextraSpace})
	if l.present {
		return p.p.New(l.total, mpb.NopStyle(), mpb.PrependDecorators(name, decor.Name("already present")))
	}
	total := l.total
	if total < 0 {
		total = 0 // unknown; completed by finish
	}
	return p.p.AddBar(total,
		mpb.PrependDecorators(name),
		mpb.AppendDecorators(
			decor.CountersKibiByte("% .1f / % .1f", decor.WC{C: decor.DextraSpace}),
			decor.OnComplete(decor.EwmaSpeed(decor.SizeB1024(0), "% .1f", 30, decor.WC{C: decor.DextraSpace}), ""),
			decor.OnComplete(decor.EwmaETA(decor.ET_STYLE_GO, 30, decor.WC{C: decor.DextraSpace}), p.verb),
		),
	)
}

// line prints the one-line summary of a finished layer (non-terminal mode).
func (p *progress) line(digest string, l *layerProgress) {
	if l.present {
		fmt.Fprintf(p.w, "%s: already present\n", layerName(digest))
		return
	}
	fmt.Fprintf(p.w, "%s: %s %s\n", layerName(digest), p.verb, humanize.IBytes(uint64(l.done)))
}

// finish completes the display: layers of unknown size are marked done
// when ok, unfinished bars are aborted otherwise.
func (p *progress) finish(ok bool) {
	p.mu.Lock()
	for _, d := range p.order {
		l := p.layers[d]
		switch {
		case l.bar != nil && !l.bar.Completed():
			if ok {
				l.bar.SetTotal(-1, true)
			} else {
				l.bar.Abort(false)
			}
		case l.bar == nil && ok && !l.printed:
			l.printed = true
			p.line(d, l)
		}
	}
	p.mu.Unlock()
	if p.p != nil {
		p.p.Wait()
	}
}
