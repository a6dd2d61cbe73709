package codebox

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/headtail"
)

//go:embed kernel.py
var kernelSource []byte

// KernelPath is where NewContext writes the kernel script in the box.
const KernelPath = "/tmp/.airlock-codebox/kernel.py"

// kernelStartTimeout bounds the wait for a new kernel's ready line.
const kernelStartTimeout = 2 * time.Minute

// Result is the outcome of one Context.Run cell.
type Result struct {
	// Stdout and Stderr are what the cell printed. Output written by its
	// subprocesses or C code straight to file descriptors 1 and 2 comes
	// after the cell's own Python-level output. Each keeps its first and
	// last 4 Mi characters; what lies between is dropped in the box
	// (Truncated is then set, and StdoutDropped/StderrDropped count the
	// characters, bytes for fd-level output).
	Stdout, Stderr string
	// StdoutDropped and StderrDropped count what was dropped.
	StdoutDropped, StderrDropped int64
	// Value is the repr() of the cell's last statement when that is an
	// expression whose value is not None, as a notebook shows it; ""
	// otherwise.
	Value string
	// Error is set when the cell raised (SyntaxError, SystemExit and
	// KeyboardInterrupt included); output printed before the exception
	// is kept in Stdout and Stderr.
	Error *Error
	// Images are the matplotlib figures left open at the end of the cell,
	// rendered as PNG (Agg backend) and then closed, like a notebook's
	// inline backend. Empty when matplotlib is not installed or not used.
	Images []Image
	// ValueData are Value's rich representations by MIME type when the
	// value has more than its repr (a pandas DataFrame's "text/html", a
	// matplotlib figure's "image/png"; see Display.Data for the forms);
	// nil otherwise.
	ValueData map[string]string
	// Displays are the objects the cell showed with display() (a
	// builtin in the interpreter, and IPython.display.display when
	// IPython is installed), in order, when the cell did not stream
	// (RunStream passes them on as they come).
	Displays []Display
	// TimedOut is true when the cell ran past its timeout (or ctx ended)
	// and was interrupted.
	TimedOut bool
	// StateLost is true when the interpreter had to be killed or had died
	// and a fresh one was started: variables, imports and functions of
	// earlier cells are gone.
	StateLost bool
	// Truncated is true when Stdout or Stderr was cut.
	Truncated bool
	// Duration is the host-side time of the call.
	Duration time.Duration
}

// Error is an exception raised by a cell.
type Error struct {
	// Name is the exception class ("ZeroDivisionError"), or "TimeoutError"
	// / "KernelDied" for an interpreter that was killed or exited.
	Name string
	// Value is str() of the exception.
	Value string
	// Traceback is the formatted traceback, the kernel's own frames
	// removed; cells appear as "<cell-N>".
	Traceback string
}

// Error returns "Name: Value".
func (e *Error) Error() string {
	if e.Value == "" {
		return e.Name
	}
	return e.Name + ": " + e.Value
}

// Image is one rich output of a cell.
type Image struct {
	// MIMEType is "image/png".
	MIMEType string `json:"mime"`
	// Data is the encoded image.
	Data []byte `json:"data"`
	// Chart is the figure's chart as E2B's code interpreter gives it (a
	// JSON object: type "line", "scatter", "bar", "pie",
	// "box_and_whisker", "superchart" or "unknown", title, axis labels,
	// units, ticks and scales, elements) when the context is Structured
	// and the figure has data; nil otherwise, and for a figure of more
	// than 200000 points or a chart over 4 MiB.
	Chart json.RawMessage `json:"chart,omitempty"`
}

// MIME types of the structured forms of a Structured context's outputs,
// in Display.Data and Result.ValueData, each JSON text, as E2B's code
// interpreter names them.
const (
	// MIMEData is a pandas DataFrame's columns: {"column": [values]}
	// (NaN as null, timestamps in ISO 8601).
	MIMEData = "e2b/data"
	// MIMEChart is a matplotlib figure's chart (see Image.Chart).
	MIMEChart = "e2b/chart"
)

// Display is one object a cell showed with display(), as a notebook
// shows it: its representations by MIME type, from the object's
// _repr_*_ methods (IPython's protocol). Data always has "text/plain"
// (its repr); others as the object offers them: text for "text/html",
// "text/markdown", "text/latex", "image/svg+xml" and
// "application/javascript", JSON text for "application/json" (and, in a
// Structured context, MIMEData and MIMEChart), base64 for
// "image/png", "image/jpeg" and "application/pdf". A display line is
// bounded as every kernel line is (32 MiB; a larger one is dropped with
// a note on stderr).
type Display struct {
	Data map[string]string `json:"data"`
}

// Context is a long-lived Python interpreter in the box: variables,
// imports and functions persist from one Run to the next. Contexts of one
// box share no state (each is its own process). Run calls on one Context
// are serialized; Close ends the interpreter.
type Context struct {
	start   func(context.Context) (kernelProc, error)
	timeout time.Duration
	grace   time.Duration
	onClose func()

	id string         // Context.ID; kept by the children of a fork
	co ContextOptions // as made

	closing   chan struct{} // closed by Close, to end a running cell
	closeOnce sync.Once

	mu     sync.Mutex // serializes Run and guards the fields below
	k      *kernel
	nextID int64
	closed bool
	sink   *sink // the running RunStream's; nil for Run
}

// kernelProc is the interpreter process: a daemon of the box reached
// through a relay exec (daemon.go), or an os/exec process in tests.
type kernelProc interface {
	Stdin() io.WriteCloser
	Stdout() io.Reader
	Stderr() io.Reader
	Signal(syscall.Signal) error
	Kill() error
	// Wait returns the exit status, or an error when the process could
	// not be waited for (the box died).
	Wait() (int, error)
}

// NewContext starts a new interpreter in the box. It writes the kernel
// script (embedded in this package) to KernelPath and runs it with
// MPLBACKEND=Agg, as a daemon of the box (daemon.go) that outlives ctx,
// which bounds only the start, and lives on in the children of
// CodeBox.Fork; Close kills it, and it dies with the box. In a box taken
// from a Pool, the first context without options adopts the interpreter
// already running there. Errors: the box is not running or died, it has
// no such interpreter (or no sh, setsid, mkfifo), or Python did not
// start.
//
// opts (at most one is used) set the interpreter's working directory and
// environment.
func (c *CodeBox) NewContext(ctx context.Context, opts ...ContextOptions) (*Context, error) {
	var co ContextOptions
	if len(opts) > 0 {
		co = opts[0]
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("codebox: closed")
	}
	c.mu.Unlock()
	var rnd [6]byte
	rand.Read(rnd[:])
	k := c.newContextValue(hex.EncodeToString(rnd[:]), co)
	if k.k = c.takeWarm(co); k.k == nil {
		if err := k.init(ctx); err != nil {
			return nil, fmt.Errorf("codebox: start context: %w", err)
		}
	}
	c.mu.Lock()
	c.contexts[k] = struct{}{}
	c.mu.Unlock()
	return k, nil
}

// newContextValue returns a Context of c whose interpreter is not
// started yet.
func (c *CodeBox) newContextValue(id string, co ContextOptions) *Context {
	k := &Context{
		closing: make(chan struct{}),
		timeout: c.opts.Timeout,
		grace:   c.opts.InterruptGrace,
		id:      id,
		co:      co,
		start: func(ctx context.Context) (kernelProc, error) {
			var rnd [6]byte
			rand.Read(rnd[:])
			dir := kernelRunDir + "/" + hex.EncodeToString(rnd[:])
			if err := launchKernel(ctx, c.box, c.opts.Python, dir, co); err != nil {
				return nil, err
			}
			return relayKernel(ctx, c.box, dir)
		},
	}
	k.onClose = func() {
		c.mu.Lock()
		delete(c.contexts, k)
		c.mu.Unlock()
	}
	return k
}

func (x *Context) init(ctx context.Context) error {
	k, err := startKernel(ctx, x.start)
	if err != nil {
		return err
	}
	x.k = k
	return nil
}

// kernel is one running interpreter.
type kernel struct {
	p       kernelProc
	stdin   io.WriteCloser
	replies chan reply // closed when stdout ends
	stderr  *headtail.Tail
	exited  chan struct{}
	code    int
	waitErr error
}

type reply struct {
	ID     *int64  `json:"id"`
	Ready  bool    `json:"ready"`
	Stdout string  `json:"stdout"`
	Stderr string  `json:"stderr"`
	Value  *string `json:"value"`
	Error  *Error  `json:"error"`
	Images []Image `json:"images"`
	// ValueData and Displays: Result's.
	ValueData map[string]string   `json:"value_data"`
	Displays  []map[string]string `json:"displays"`
	Truncated bool                `json:"truncated"`
	OutDrop   int64               `json:"stdout_dropped"`
	ErrDrop   int64               `json:"stderr_dropped"`
	// Stream ("stdout" or "stderr") marks a piece of a streamed cell's
	// output (Text), not its reply.
	Stream string `json:"stream"`
	Text   string `json:"text"`
	// Image is a figure a streamed cell showed (plt.show()) as it ran.
	Image *Image `json:"image"`
	// Display is an object a streamed cell showed with display().
	Display map[string]string `json:"display"`
	// tooLong marks a line over maxMessage, dropped unread.
	tooLong bool
}

// maxMessage bounds one line the interpreter writes to the host: the
// kernel keeps its replies under 32 MiB (MESSAGE_LIMIT in kernel.py); a
// longer line (a cell writing to the protocol pipe itself) is discarded as
// it is read, and the interpreter restarted.
const maxMessage = 32<<20 + 64<<10

func startKernel(ctx context.Context, start func(context.Context) (kernelProc, error)) (*kernel, error) {
	p, err := start(ctx)
	if err != nil {
		return nil, err
	}
	k := &kernel{p: p, stdin: p.Stdin(), replies: make(chan reply, 1), stderr: &headtail.Tail{Max: 64 << 10}, exited: make(chan struct{})}
	go func() {
		defer close(k.replies)
		r := bufio.NewReaderSize(p.Stdout(), 64<<10)
		for {
			line, tooLong, err := headtail.ReadLine(r, maxMessage)
			if tooLong {
				k.replies <- reply{tooLong: true}
			} else if len(bytes.TrimSpace(line)) > 0 {
				var rep reply
				if json.Unmarshal(line, &rep) == nil {
					k.replies <- rep
				}
			}
			if err != nil {
				return
			}
		}
	}()
	go io.Copy(k.stderr, p.Stderr())
	go func() {
		k.code, k.waitErr = p.Wait()
		close(k.exited)
	}()
	t := time.NewTimer(kernelStartTimeout)
	defer t.Stop()
	select {
	case rep, ok := <-k.replies:
		if ok && rep.Ready {
			return k, nil
		}
		k.kill()
		return nil, fmt.Errorf("python did not start: %s", k.died())
	case <-ctx.Done():
		k.kill()
		return nil, ctx.Err()
	case <-t.C:
		k.kill()
		return nil, fmt.Errorf("python did not start within %s", kernelStartTimeout)
	}
}

// kill ends the interpreter and waits (briefly) for it to be gone.
func (k *kernel) kill() {
	k.p.Kill()
	select {
	case <-k.exited:
	case <-time.After(10 * time.Second):
	}
}

// died describes why the interpreter ended; call it once stdout ended.
func (k *kernel) died() string {
	select {
	case <-k.exited:
	case <-time.After(10 * time.Second):
		return "the interpreter stopped answering"
	}
	msg := fmt.Sprintf("the interpreter exited with status %d", k.code)
	if k.waitErr != nil {
		msg = k.waitErr.Error()
	}
	if s := strings.TrimSpace(k.stderr.String()); s != "" {
		msg += "; its stderr: " + s
	}
	return msg
}

// Run runs code in the context and returns its result. An exception in
// the code is not a Go error: it is Result.Error (with the output printed
// before it). When the cell runs past Options.Timeout, or ctx ends, it is
// interrupted with SIGINT (KeyboardInterrupt; state kept, TimedOut set);
// if it has not stopped within Options.InterruptGrace the interpreter is
// killed and a new one started: Result.StateLost is set and Error is a
// TimeoutError. An interpreter that exits by itself (os._exit, a crash)
// is restarted the same way (Error "KernelDied"). The output of a killed
// or crashed cell is lost.
//
// The error is non-nil when ctx ended (ctx.Err(), with the Result of the
// interrupted cell), when the Context is closed, or when the box is gone
// and no new interpreter could be started.
func (x *Context) Run(ctx context.Context, code string) (*Result, error) {
	return x.RunStream(ctx, code, nil)
}

// Chunk is a piece of a cell's output, as RunStream passes it on.
type Chunk struct {
	// Stderr is true for the cell's standard error, false for its
	// standard output.
	Stderr bool
	// Text is the piece.
	Text string
	// Image, when set, is a figure the cell showed (plt.show()) as it
	// ran, rendered as PNG (and closed); Text is then empty. It is not in
	// Result.Images, which holds the figures left open at the end.
	Image *Image
	// Display, when set, is an object the cell showed with display();
	// Text is then empty.
	Display *Display
}

// maxStreamed bounds what the host keeps of one stream of a streamed cell
// (the kernel sends at most its output limit; more is dropped and counted
// in the Result's StdoutDropped/StderrDropped).
const maxStreamed = maxMessage

// RunStream is Run, with the cell's output also passed to on as the cell
// prints it (on nil: Run). Python-level output (print, sys.stdout.write)
// comes at each newline, flush() or 64 Ki characters; what the kernel
// drops past its first half of the output limit comes at the end as the
// drop note and the tail, as does the output of subprocesses and C code
// (file descriptors 1 and 2). Each stream's chunks come in order and,
// joined, are the Result's Stdout or Stderr; stdout and stderr chunks have
// no order between them. Output printed before a cell was killed is kept.
//
// on runs in the caller's goroutine, before RunStream returns and never
// after; while it blocks, the cell blocks at its next print and the
// timeout is not checked, so on should return promptly (a sink that may
// stall should bound its writes with a deadline).
func (x *Context) RunStream(ctx context.Context, code string, on func(Chunk)) (*Result, error) {
	t0 := time.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil, errClosed
	}
	if on != nil {
		x.sink = &sink{on: on}
		defer func() { x.sink = nil }()
	}
	res, err := x.run(ctx, code)
	if res != nil {
		if x.sink != nil {
			x.sink.finish(res)
		}
		res.Duration = time.Since(t0)
	}
	return res, err
}

// sink collects a streamed cell's output and passes it on.
type sink struct {
	on               func(Chunk)
	out, err         strings.Builder
	outDrop, errDrop int64
}

func (s *sink) add(stderr bool, text string) {
	b, drop := &s.out, &s.outDrop
	if stderr {
		b, drop = &s.err, &s.errDrop
	}
	if b.Len()+len(text) <= maxStreamed {
		b.WriteString(text)
	} else {
		*drop += int64(len(text))
	}
	s.on(Chunk{Stderr: stderr, Text: text})
}

// finish puts the streamed output in res. A reply that carries output
// (a kernel that does not stream: one in a box made by an older airlock)
// passes it on first.
func (s *sink) finish(res *Result) {
	if res.Stdout != "" {
		s.add(false, res.Stdout)
	}
	if res.Stderr != "" {
		s.add(true, res.Stderr)
	}
	res.Stdout, res.Stderr = s.out.String(), s.err.String()
	if s.outDrop > 0 || s.errDrop > 0 {
		res.StdoutDropped += s.outDrop
		res.StderrDropped += s.errDrop
		res.Truncated = true
	}
}

// streamed handles a piece of streamed output: it reports whether rep was
// one (passed on when it is cell id's and a RunStream is running).
func (x *Context) streamed(rep reply, id int64) bool {
	if rep.Stream == "" && rep.Image == nil && rep.Display == nil {
		return false
	}
	if x.sink != nil && rep.ID != nil && *rep.ID == id {
		if rep.Image != nil {
			x.sink.on(Chunk{Image: rep.Image})
		} else if rep.Display != nil {
			x.sink.on(Chunk{Display: &Display{Data: rep.Display}})
		} else {
			x.sink.add(rep.Stream == "stderr", rep.Text)
		}
	}
	return true
}

func (x *Context) run(ctx context.Context, code string) (*Result, error) {
	x.reattach(ctx)
	if x.k == nil {
		if err := x.init(ctx); err != nil {
			return nil, fmt.Errorf("codebox: restart context: %w", err)
		}
	}
	k := x.k
	if dp, ok := k.p.(*daemonProc); ok {
		// Its relay is a Background exec: the cell is the use.
		defer dp.box.Use(ctx)()
	}
	x.nextID++
	id := x.nextID
	req, _ := json.Marshal(map[string]any{"id": id, "code": code, "stream": x.sink != nil, "structured": x.co.Structured})
	if _, err := k.stdin.Write(append(req, '\n')); err != nil {
		return x.lost(ctx, "KernelDied", k.died(), false)
	}
	var timer <-chan time.Time
	if x.timeout > 0 {
		t := time.NewTimer(x.timeout)
		defer t.Stop()
		timer = t.C
	}
	for {
		select {
		case rep, ok := <-k.replies:
			if !ok {
				return x.lost(ctx, "KernelDied", k.died(), false)
			}
			if rep.tooLong {
				return x.lost(ctx, "ProtocolError", errTooLong, false)
			}
			if x.streamed(rep, id) {
				continue
			}
			if rep.ID == nil || *rep.ID != id {
				continue // not this cell's (cannot happen with this kernel)
			}
			return rep.result(), nil
		case <-timer:
			return x.interrupt(ctx, id, nil)
		case <-ctx.Done():
			return x.interrupt(ctx, id, ctx.Err())
		case <-x.closing:
			k.kill()
			x.k = nil
			return nil, errClosed
		}
	}
}

var errClosed = errors.New("codebox: context closed")

// errTooLong is the Error value of a cell whose interpreter wrote an
// over-long line to the host.
var errTooLong = fmt.Sprintf("the interpreter wrote a message over %d MiB to the host (did the cell write to the kernel's protocol pipe?); it was dropped, and the interpreter killed and restarted", maxMessage>>20)

// interrupt sends SIGINT to the interpreter and waits for the cell's
// reply; past the grace it restarts the interpreter.
func (x *Context) interrupt(ctx context.Context, id int64, ctxErr error) (*Result, error) {
	k := x.k
	k.p.Signal(syscall.SIGINT)
	t := time.NewTimer(x.grace)
	defer t.Stop()
	for {
		select {
		case rep, ok := <-k.replies:
			if !ok {
				res, err := x.lost(ctx, "KernelDied", k.died(), true)
				return res, errors.Join(err, ctxErr)
			}
			if rep.tooLong {
				res, err := x.lost(ctx, "ProtocolError", errTooLong, true)
				return res, errors.Join(err, ctxErr)
			}
			if x.streamed(rep, id) {
				continue
			}
			if rep.ID == nil || *rep.ID != id {
				continue
			}
			res := rep.result()
			// A cell that finished as the timer fired (its reply crossed
			// the SIGINT) ran to completion: it did not time out.
			res.TimedOut = res.Error != nil && res.Error.Name == "KeyboardInterrupt"
			return res, ctxErr
		case <-t.C:
			k.kill()
			what := "the cell did not stop"
			if x.timeout > 0 && ctxErr == nil {
				what = fmt.Sprintf("the cell ran past its %s timeout", x.timeout)
			}
			msg := fmt.Sprintf("%s and did not stop within %s of SIGINT; the interpreter was killed and restarted, and its state was lost", what, x.grace)
			res, err := x.lost(ctx, "TimeoutError", msg, true)
			return res, errors.Join(err, ctxErr)
		}
	}
}

// reattach gives the context a new relay to its interpreter when the
// relay ended but the interpreter may live on: its box's machine ended
// under it (suspended when idle, airlock.IdleSuspend), and the relay
// exec, which wakes the box, reaches the interpreter with its variables
// as they were. When the interpreter is gone, nothing changes: the cell
// then finds it dead, and a new one starts (StateLost).
func (x *Context) reattach(ctx context.Context) {
	if x.k == nil {
		return
	}
	dp, ok := x.k.p.(*daemonProc)
	if !ok {
		return
	}
	select {
	case <-x.k.exited:
	default:
		if info, err := dp.box.Info(ctx); err != nil || info.State == airlock.BoxRunning {
			return // the relay runs
		}
		// The machine ended under the relay: the relay's end is on its
		// way (its connection drops).
		t := time.NewTimer(10 * time.Second)
		defer t.Stop()
		select {
		case <-x.k.exited:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
	if k, err := attachKernel(ctx, dp.box, dp.dir); err == nil {
		x.k = k
	}
}

// lost replaces a dead or killed interpreter with a new one and returns
// the Result that says so.
func (x *Context) lost(ctx context.Context, name, msg string, timedOut bool) (*Result, error) {
	x.k.kill()
	x.k = nil
	res := &Result{Error: &Error{Name: name, Value: msg}, StateLost: true, TimedOut: timedOut}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), kernelStartTimeout)
	defer cancel()
	if err := x.init(sctx); err != nil {
		return res, fmt.Errorf("codebox: %s; a new interpreter could not be started: %w", msg, err)
	}
	return res, nil
}

func (r reply) result() *Result {
	res := &Result{Stdout: r.Stdout, Stderr: r.Stderr, Error: r.Error, Images: r.Images, Truncated: r.Truncated,
		StdoutDropped: r.OutDrop, StderrDropped: r.ErrDrop}
	if r.Value != nil {
		res.Value = *r.Value
		res.ValueData = r.ValueData
	}
	for _, d := range r.Displays {
		res.Displays = append(res.Displays, Display{Data: d})
	}
	return res
}

// Close ends the interpreter; its state is gone. A Run in progress is
// stopped (its interpreter killed) and returns an error. Closing twice is
// a no-op.
func (x *Context) Close() error {
	x.closeOnce.Do(func() { close(x.closing) })
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	x.closed = true
	if x.k != nil {
		x.k.stdin.Close()
		select {
		case <-x.k.exited:
		case <-time.After(2 * time.Second):
			x.k.kill()
		}
		x.k = nil
	}
	if x.onClose != nil {
		x.onClose()
	}
	return nil
}
