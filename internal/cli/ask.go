package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/interp"
)

func init() { extraCommands = append(extraCommands, newAskCmd) }

type askFlags struct {
	model    string
	oneShot  bool
	maxSteps int
	showCode bool
	outDir   string
	timeout  time.Duration
	image    string
	files    []string
}

func newAskCmd() *cobra.Command {
	var af askFlags
	var bf boxFlags
	cmd := &cobra.Command{
		Use:   "ask [flags] TASK...",
		Short: "Let a language model answer a task by running Python in a box",
		Long: `Ask an OpenAI-compatible model to do TASK (the arguments, or standard input
when there are none) with a Python interpreter that runs in a box.

Tool mode (default): the model gets one tool, execute_python(code). Every call
runs in one long-lived interpreter in one box, so variables and imports persist;
the tool's result carries stdout, stderr, the last expression's value, the
traceback when the code raised, and a note of images produced (matplotlib
figures, with an image that has matplotlib). The loop ends when the model
answers without calling the tool, or after --max-steps rounds. The answer is
printed on stdout; --out DIR saves the images and prints their paths.

--one-shot: ask for code once, take its fenced Python blocks (py, python,
python3; else unlabelled ones; else shell ones; prose around them is dropped;
with no fence, the whole reply), run them once in a fresh interpreter and
print the output; on failure the traceback goes to stderr.

--file F (repeatable) puts F in the box as /data/<name> and tells the model
so; with --out DIR, the files the code writes under /out come back into DIR
(their paths are printed as "file: PATH").

Environment: OPENAI_API_KEY (required; any value for an endpoint that needs
none), OPENAI_BASE_URL (an OpenAI-compatible endpoint, ending in /v1; default
OpenAI's), AIRLOCK_MODEL (the model id, unless --model).

Exit status: 0 on an answer; 1 when the model's endpoint failed, the step
limit was reached or, with --one-shot, the code failed; 124 when one-shot code
timed out; 125 when the box could not start; 130 when interrupted.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if af.maxSteps < 1 {
				return usagef(cmd, "ask: --max-steps %d: want 1 or more rounds of tool calls", af.maxSteps)
			}
			task := strings.TrimSpace(strings.Join(args, " "))
			if task == "" {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return err
				}
				task = strings.TrimSpace(string(b))
			}
			if task == "" {
				return usagef(cmd, "ask: missing TASK: give it as arguments, e.g. airlock ask 'compute the first 10 primes', or on standard input")
			}
			return runAsk(cmd, task, af, bf)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&af.model, "model", "", "model id the endpoint serves (default $AIRLOCK_MODEL)")
	fl.BoolVar(&af.oneShot, "one-shot", false, "ask for code once, run it once and print its output (no tool calls)")
	fl.IntVar(&af.maxSteps, "max-steps", interp.DefaultMaxSteps, "stop after this many rounds of tool calls")
	fl.BoolVar(&af.showCode, "show-code", false, "show each code block and its output on stderr")
	fl.StringVar(&af.outDir, "out", "", "save images produced by the code in this directory and print their paths")
	fl.DurationVar(&af.timeout, "timeout", 2*time.Minute, "time limit for each run of the model's code (0: none)")
	fl.StringVar(&af.image, "image", airlock.DefaultImage, "image of the box (must have python3)")
	fl.StringArrayVar(&af.files, "file", nil, "put this host file in the box under /data (the model is told its path), repeatable; with --out, files the code writes under /out come back too")
	bf.add(cmd, false)
	return cmd
}

// startError is a box that could not start.
type startError struct{ err error }

// Error says the sandbox failed to start, and why.
func (e *startError) Error() string { return "sandbox failed to start: " + e.err.Error() }

// Unwrap returns the cause.
func (e *startError) Unwrap() error { return e.err }

// sandbox boots a CodeBox (and a context, for tool mode) in the background,
// so the box boots while the model thinks.
type sandbox struct {
	cancel context.CancelFunc
	done   chan struct{}
	cb     *codebox.CodeBox
	cx     *codebox.Context
	err    error
	// warns holds the runtime's warnings until the box first runs code
	// (nil: none held).
	warns *heldWarnings
}

// heldWarnings holds the runtime's warnings (TCG, ...) until release:
// ask boots its box while the model thinks, so a command that fails
// before any code runs (the model unreachable, a model that is not
// served) has run nothing in a box, and warns of nothing, as commands
// that boot nothing do (docs/cli.md).
type heldWarnings struct {
	w        func(string)
	mu       sync.Mutex
	held     []string
	released bool
}

// warn passes msg on once released, else holds it.
func (h *heldWarnings) warn(msg string) {
	h.mu.Lock()
	if !h.released {
		h.held = append(h.held, msg)
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	h.w(msg)
}

// release passes on what was held, and every later warning as it comes.
func (h *heldWarnings) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	held := h.held
	h.held, h.released = nil, true
	h.mu.Unlock()
	for _, m := range held {
		h.w(m)
	}
}

func startSandbox(ctx context.Context, rt *airlock.Runtime, opts codebox.Options, withContext bool, files []string, warns *heldWarnings) *sandbox {
	ctx, cancel := context.WithCancel(ctx)
	s := &sandbox{cancel: cancel, done: make(chan struct{}), warns: warns}
	go func() {
		defer close(s.done)
		s.cb, s.err = codebox.New(ctx, rt, opts)
		if s.err == nil {
			s.err = askCopyIn(ctx, s.cb, files)
		}
		if s.err == nil && withContext {
			s.cx, s.err = s.cb.NewContext(ctx)
		}
		if s.err != nil {
			s.err = &startError{s.err}
		}
	}()
	return s
}

func (s *sandbox) wait(ctx context.Context) error {
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run implements interp.Executor.
func (s *sandbox) Run(ctx context.Context, code string) (*codebox.Result, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	s.warns.release()
	return s.cx.Run(ctx, code)
}

// close stops a boot in progress and removes the box.
func (s *sandbox) close() error {
	s.cancel()
	<-s.done
	if s.cb != nil {
		return s.cb.Close()
	}
	return nil
}

func runAsk(cmd *cobra.Command, task string, af askFlags, bf boxFlags) error {
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	llm, err := interp.NewOpenAI(interp.ConfigFromEnv(af.model))
	if err != nil {
		return err
	}
	bo, err := bf.options(cmd, af.image)
	if err != nil {
		return usagef(cmd, "ask: %v", err)
	}
	// On a terminal, a status line on stderr says what is going on; what
	// else goes to stderr (warnings, pull progress) erases it first.
	prog := newAskProgress(stderr)
	defer prog.end()
	if prog.on {
		stderr = clearing{prog, stderr}
	}
	warns := &heldWarnings{w: warner(stderr)}
	rt, err := airlock.Open(airlock.Options{Warn: warns.warn, Pull: pullWithProgress(cmd.Context(), stderr)})
	if err != nil {
		return err
	}
	defer rt.Close()
	ctx := cmd.Context()
	opts := codebox.Options{BoxOptions: bo, Timeout: af.timeout}
	sb := startSandbox(ctx, rt, opts, !af.oneShot, af.files, warns)
	prog.watchBoot(sb)
	pllm := &progressLLM{LLM: llm, p: prog, maxSteps: af.maxSteps}
	defer func() {
		prog.end()
		if err := sb.close(); err != nil {
			fmt.Fprintln(stderr, "airlock:", err)
		}
	}()
	task = askTask(task, af.files, af.outDir)
	if af.outDir != "" {
		defer func() {
			if sb.wait(ctx) == nil {
				if err := askCopyOut(ctx, stdout, sb.cb, af.outDir); err != nil {
					fmt.Fprintln(stderr, "airlock: bringing back /out:", err)
				}
			}
		}()
	}
	if af.oneShot {
		pllm.maxSteps = 0
		return askOneShot(ctx, prog, stdout, stderr, pllm, sb, task, af)
	}
	var log io.Writer
	if af.showCode {
		log = stderr
	}
	it := &interp.Interpreter{LLM: pllm, Exec: progressExec{sb, prog, pllm}, MaxSteps: af.maxSteps, Log: log, OutDir: af.outDir}
	ans, err := it.Ask(ctx, task)
	prog.end()
	if err != nil {
		if errors.Is(err, interp.ErrMaxSteps) && ans.Text != "" {
			fmt.Fprintln(stdout, ans.Text)
		}
		return askFailed(stderr, err)
	}
	fmt.Fprintln(stdout, strings.TrimRight(ans.Text, "\n"))
	for _, p := range ans.Images {
		fmt.Fprintln(stdout, "image:", p)
	}
	return nil
}

// runner adapts a sandbox to interp.Runner.
type runner struct{ sb *sandbox }

// Run waits for the box, then runs code once with CodeBox.Run.
func (r runner) Run(ctx context.Context, code string) (string, error) {
	if err := r.sb.wait(ctx); err != nil {
		return "", err
	}
	r.sb.warns.release()
	return r.sb.cb.Run(ctx, code)
}

func askOneShot(ctx context.Context, prog *askProgress, stdout, stderr io.Writer, llm interp.LLM, sb *sandbox, task string, af askFlags) error {
	// The seed's loop; --show-code prints the code before it runs.
	reply, err := llm.Chat(ctx, []interp.Message{{Role: interp.RoleUser, Content: fmt.Sprintf(interp.OneShotPrompt, task)}}, nil)
	if err != nil {
		return askFailed(stderr, err)
	}
	code := interp.ExtractCode(reply.Content)
	if af.showCode {
		fmt.Fprintf(stderr, "--- code\n%s\n--- output\n", code)
	}
	prog.set("", "running code")
	out, err := runner{sb}.Run(ctx, code)
	prog.end()
	io.WriteString(stdout, out)
	var ee *codebox.ExecError
	if errors.As(err, &ee) {
		io.WriteString(stderr, ee.Stderr)
		fmt.Fprintln(stderr, "airlock: the generated code failed:", ee)
		if ee.TimedOut {
			return &ExitError{124}
		}
		return &ExitError{1}
	}
	if err != nil {
		return askFailed(stderr, err)
	}
	return nil
}

// askFailed reports err and returns the exit status for it.
func askFailed(stderr io.Writer, err error) error {
	fmt.Fprintln(stderr, "airlock:", err)
	var se *startError
	switch {
	case errors.As(err, &se):
		fmt.Fprintln(stderr, "airlock: check `airlock doctor` (QEMU, guest kernel, KVM) and that the image is in the store (`airlock images`)")
		return &ExitError{125}
	case errors.Is(err, context.Canceled):
		return &ExitError{130}
	case errors.Is(err, interp.ErrMaxSteps):
		fmt.Fprintln(stderr, "airlock: raise --max-steps to let the model go on")
	}
	return &ExitError{1}
}
