package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/interp"
)

// askProgress is the status line airlock ask keeps on a terminal's stderr:
// "⠋ booting box · waiting for the model (step 1/10) · 3s". It is
// rewritten in place and erased before anything else is printed; off a
// terminal it prints nothing.
type askProgress struct {
	w    io.Writer
	on   bool
	t0   time.Time
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	box      string // "booting box", "box ready", "" once not worth saying
	activity string // "waiting for the model (step 1/10)", "running code (step 1/10)"
	shown    bool
	frame    int
}

var spinner = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

// newAskProgress returns a progress line on w, live only when w is a
// terminal.
func newAskProgress(w io.Writer) *askProgress {
	p := &askProgress{w: w, t0: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.on = true
		go p.tick()
	} else {
		close(p.done)
	}
	return p
}

func (p *askProgress) tick() {
	defer close(p.done)
	t := time.NewTicker(120 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			p.frame++
			p.drawLocked()
			p.mu.Unlock()
		}
	}
}

// set changes the box state and/or the activity ("" keeps it).
func (p *askProgress) set(box, activity string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.on {
		return
	}
	if box != "" {
		p.box = box
	}
	if activity != "" {
		p.activity = activity
	}
	p.drawLocked()
}

func (p *askProgress) drawLocked() {
	line := spinner[p.frame%len(spinner)] + " "
	sep := ""
	for _, s := range []string{p.box, p.activity} {
		if s != "" {
			line += sep + s
			sep = " · "
		}
	}
	line += fmt.Sprintf(" · %ds", int(time.Since(p.t0).Seconds()))
	fmt.Fprint(p.w, "\r\033[K"+line)
	p.shown = true
}

// clear erases the line (before other output); the next set draws it
// again.
func (p *askProgress) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
}

func (p *askProgress) clearLocked() {
	if p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}

// end stops the line and erases it.
func (p *askProgress) end() {
	p.mu.Lock()
	if p.on {
		select {
		case <-p.stop:
		default:
			close(p.stop)
		}
	}
	p.mu.Unlock()
	<-p.done
	p.mu.Lock()
	p.on = false
	p.clearLocked()
	p.mu.Unlock()
}

// clearing is a writer that erases the progress line before each write
// (for --show-code, which logs to the same stderr).
type clearing struct {
	p *askProgress
	w io.Writer
}

func (c clearing) Write(b []byte) (int, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.clearLocked()
	return c.w.Write(b)
}

// progressLLM reports each model call as a step.
type progressLLM struct {
	interp.LLM
	p        *askProgress
	maxSteps int
	step     int
}

func (l *progressLLM) Chat(ctx context.Context, messages []interp.Message, tools []interp.Tool) (interp.Message, error) {
	l.step++
	if l.maxSteps > 0 {
		l.p.set("", fmt.Sprintf("waiting for the model (step %d/%d)", min(l.step, l.maxSteps), l.maxSteps))
	} else {
		l.p.set("", "waiting for the model")
	}
	return l.LLM.Chat(ctx, messages, tools)
}

// progressExec reports each run of the model's code.
type progressExec struct {
	interp.Executor
	p   *askProgress
	llm *progressLLM
}

func (e progressExec) Run(ctx context.Context, code string) (*codebox.Result, error) {
	e.p.set("", fmt.Sprintf("running code (step %d/%d)", min(e.llm.step, e.llm.maxSteps), e.llm.maxSteps))
	return e.Executor.Run(ctx, code)
}

// watchBoot shows "booting box" until the sandbox is up.
func (p *askProgress) watchBoot(sb *sandbox) {
	p.mu.Lock()
	on := p.on
	p.mu.Unlock()
	if !on {
		return
	}
	p.set("booting box", "")
	go func() {
		select {
		case <-sb.done:
			if sb.err == nil {
				p.set("box ready", "")
			} else {
				p.set("box failed", "")
			}
		case <-p.stop:
		}
	}()
}
