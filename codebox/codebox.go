// Package codebox runs Python in an airlock box: one-off snippets
// (CodeBox.Run) and stateful, notebook-like
// contexts (CodeBox.NewContext) that keep variables, imports and functions
// between calls and return the value of the last expression, the exception
// and any matplotlib figures.
//
// A CodeBox is a box made from an image with Python (default python:slim).
// Everything the code does happens inside the box's VM; the host only sends
// source text and reads output back.
//
// Failures and limits:
//   - Run returns the stdout it got and, when Python exits non-zero, an
//     *ExecError carrying the exit code, stdout and stderr (the traceback).
//   - Timeouts are enforced: Options.Timeout or a context deadline kills the
//     Python process and everything it started, and the error says it timed
//     out.
//   - Close stops and removes the box.
package codebox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-run/airlock"
)

// Defaults for Options fields left zero.
const (
	DefaultPython         = "python3"
	DefaultInterruptGrace = 5 * time.Second
)

// Options describe a CodeBox. The embedded BoxOptions pass through to
// Runtime.Create unchanged, except that an empty Image means
// airlock.DefaultImage (python:slim); the image must have Python 3 (and pip
// for InstallPackage).
type Options struct {
	airlock.BoxOptions

	// Timeout bounds each Run, RunScript and Context.Run call (0: no
	// limit beyond the context's deadline). It does not apply to
	// InstallPackage, which only ctx bounds.
	Timeout time.Duration
	// InterruptGrace is how long a timed-out Context cell has, after
	// SIGINT, to stop before its interpreter is killed and restarted
	// (default 5 s). For Run it is the delay between SIGTERM and SIGKILL
	// (ExecOptions.KillGrace; airlock's default when 0).
	InterruptGrace time.Duration
	// Python is the interpreter to run (default "python3", looked up in
	// the box's PATH).
	Python string
	// IndexURL is pip's --index-url for InstallPackage(s), e.g. a PEP 503
	// simple index. Empty means pip's default (PyPI, which needs network).
	// An http:// index is also passed as --trusted-host. A server on the
	// host's 127.0.0.1:8080 is http://host.airlock.internal:8080/simple/
	// here, once BoxOptions.AllowHostPorts opens port 8080 (boxes reach
	// nothing else of the host). Under a NetworkAllowlist, PyPI needs
	// AllowNet: []string{"pypi.org:443", "files.pythonhosted.org:443"}.
	IndexURL string
	// MaxOutput bounds each of stdout and stderr kept by Run, RunScript
	// and InstallPackages, in bytes (airlock.ExecOptions.MaxOutput: 0 means
	// airlock.DefaultMaxOutput, 16 MiB; negative keeps all): past it the
	// head and tail are kept and the middle is dropped inside the box.
	// Context cells keep the first and last 4 Mi characters of each
	// (Result.Truncated).
	MaxOutput int64
}

// CodeBox is a box with Python and calls to run Python in it. Its methods
// are safe for concurrent use.
type CodeBox struct {
	box       *airlock.Box
	opts      Options
	killGrace time.Duration // Options.InterruptGrace as given, for Run

	mu       sync.Mutex
	contexts map[*Context]struct{}
	closed   bool
	attached bool // made by Attach: Close leaves the box alone
}

// New creates and starts a box for opts (see Runtime.Create for its
// errors: image not found, boot failure...). Call Close to remove it.
func New(ctx context.Context, rt *airlock.Runtime, opts Options) (*CodeBox, error) {
	if opts.Image == "" {
		opts.Image = airlock.DefaultImage
	}
	// A CodeBox lives as long as its program: Close removes it, and if the
	// program dies first the next airlock.Open removes it (AutoRemove
	// records the owner).
	opts.AutoRemove = true
	if opts.Python == "" {
		opts.Python = DefaultPython
	}
	killGrace := opts.InterruptGrace
	if opts.InterruptGrace <= 0 {
		opts.InterruptGrace = DefaultInterruptGrace
	}
	b, err := rt.Create(ctx, opts.BoxOptions)
	if err != nil {
		return nil, fmt.Errorf("codebox: %w", err)
	}
	return &CodeBox{box: b, opts: opts, killGrace: killGrace, contexts: map[*Context]struct{}{}}, nil
}

// Box returns the underlying box (for file copies, GuestInfo, ...).
func (c *CodeBox) Box() *airlock.Box { return c.box }

// Close closes the box's contexts, then stops and removes the box (unless
// the CodeBox was made by Attach). It waits at most 30 s. Closing twice is
// a no-op.
func (c *CodeBox) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	ctxs := make([]*Context, 0, len(c.contexts))
	for k := range c.contexts {
		ctxs = append(ctxs, k)
	}
	c.mu.Unlock()
	for _, k := range ctxs {
		k.Close()
	}
	if c.attached {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.box.Remove(ctx, true)
	c.box.Close()
	return err
}

// ExecError reports Python code that did not succeed: a non-zero exit
// status, or a timeout. Stdout holds what the code printed before it
// failed; Stderr holds the traceback.
type ExecError struct {
	// ExitCode is Python's exit status (1 for an uncaught exception;
	// 128+N when signal N killed it, as on a timeout).
	ExitCode int
	// Stdout and Stderr are the output, decoded as text.
	Stdout, Stderr string
	// TimedOut is true when Options.Timeout or the context deadline killed
	// the process tree; Timeout is the limit that applied (the sooner of
	// the two; 0 when unknown).
	TimedOut bool
	Timeout  time.Duration
}

// Error says what happened: the timeout, or the exit status with the last
// line of stderr (the exception, for a traceback).
func (e *ExecError) Error() string {
	if e.TimedOut {
		if e.Timeout > 0 {
			return fmt.Sprintf("python timed out after %s; it and every process it started were killed", e.Timeout)
		}
		return "python timed out; it and every process it started were killed"
	}
	last := lastLine(e.Stderr)
	if last == "" {
		return fmt.Sprintf("python exited with status %d", e.ExitCode)
	}
	return fmt.Sprintf("python exited with status %d: %s", e.ExitCode, last)
}

// Is makes errors.Is(err, context.DeadlineExceeded) true for a timeout.
func (e *ExecError) Is(target error) bool {
	return e.TimedOut && target == context.DeadlineExceeded
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return strings.TrimSpace(s)
}

// maxArg is the largest code passed as a python -c argument; longer code
// goes through a file in the box (Linux limits one argument to 128 KiB).
const maxArg = 96 << 10

// Run runs code with `python -c` in a fresh interpreter and returns its
// standard output. A non-zero exit returns the stdout produced so far
// together with an *ExecError (exit code, stdout, stderr with the traceback), and
// Options.Timeout or a ctx deadline is enforced: the Python process tree
// is killed and the *ExecError has TimedOut set. Output past
// Options.MaxOutput keeps its head and tail with a marker line between
// them saying how many bytes were left out (RunOutput counts them). Other
// errors: the box is not running or died (airlock.ErrBoxNotRunning,
// airlock.ErrBoxDied), or ctx was cancelled.
func (c *CodeBox) Run(ctx context.Context, code string) (string, error) {
	out, err := c.RunOutput(ctx, code)
	return out.Stdout, err
}

// Output is what a run printed (RunOutput).
type Output struct {
	// Stdout and Stderr are the output, decoded as text; where bytes were
	// dropped (Options.MaxOutput) a marker line between the kept head
	// and tail says how many.
	Stdout, Stderr string
	// StdoutDropped and StderrDropped count the bytes dropped; Truncated
	// is true when either is not 0.
	StdoutDropped, StderrDropped int64
	Truncated                    bool
	// ExitCode is Python's exit status.
	ExitCode int
}

// RunOutput runs code as Run does and returns both streams and what was
// dropped of them; a non-zero exit or a timeout is also an *ExecError, as
// with Run.
func (c *CodeBox) RunOutput(ctx context.Context, code string) (Output, error) {
	if len(code) <= maxArg {
		return c.python(ctx, []string{"-c", code})
	}
	p, err := c.writeTemp(ctx, "cell.py", []byte(code))
	if err != nil {
		return Output{}, err
	}
	defer c.removeTemp(p)
	return c.python(ctx, []string{p})
}

// RunScript reads the Python file hostPath on the host, copies it into the
// box and runs it, as Run does (same result and errors; tracebacks name
// the file by its base name).
func (c *CodeBox) RunScript(ctx context.Context, hostPath string) (string, error) {
	src, err := os.ReadFile(hostPath)
	if err != nil {
		return "", fmt.Errorf("codebox: %w", err)
	}
	p, err := c.writeTemp(ctx, filepath.Base(hostPath), src)
	if err != nil {
		return "", err
	}
	defer c.removeTemp(p)
	out, err := c.python(ctx, []string{p})
	return out.Stdout, err
}

func (c *CodeBox) python(ctx context.Context, args []string) (Output, error) {
	start := time.Now()
	opts := airlock.ExecOptions{Timeout: c.opts.Timeout, Stdin: strings.NewReader(""), MaxOutput: c.opts.MaxOutput}
	if c.killGrace > 0 {
		opts.KillGrace = c.killGrace
	}
	res, err := c.box.Exec(ctx, c.opts.Python, args, opts)
	var out Output
	if res != nil {
		out = Output{Stdout: marked(res.Stdout, res.StdoutDropped, "stdout"), Stderr: marked(res.Stderr, res.StderrDropped, "stderr"),
			StdoutDropped: res.StdoutDropped, StderrDropped: res.StderrDropped, Truncated: res.Truncated, ExitCode: res.ExitCode}
	}
	timedOut := (res != nil && res.TimedOut) || errors.Is(err, context.DeadlineExceeded)
	if err != nil && !timedOut {
		return out, err
	}
	if timedOut || res.ExitCode != 0 {
		ee := &ExecError{Stdout: out.Stdout, Stderr: out.Stderr, TimedOut: timedOut, Timeout: c.opts.Timeout, ExitCode: out.ExitCode}
		if dl, ok := ctx.Deadline(); ok && timedOut {
			if d := dl.Sub(start).Round(time.Millisecond); ee.Timeout == 0 || d < ee.Timeout {
				ee.Timeout = d // the context's deadline came first
			}
		}
		return out, ee
	}
	return out, nil
}

// marked is b as text with a marker line where dropped bytes were taken
// out: an exec past its MaxOutput keeps its first half (rounded up) and
// its last half, so the cut is at len(b) - len(b)/2.
func marked(b []byte, dropped int64, stream string) string {
	if dropped <= 0 {
		return string(b)
	}
	cut := len(b) - len(b)/2
	return string(b[:cut]) + fmt.Sprintf("\n[airlock: %d bytes of %s left out here (MaxOutput)]\n", dropped, stream) + string(b[cut:])
}

// tempSeq makes temporary directory names unique among concurrent calls.
var tempSeq atomic.Int64

// writeTemp writes data to a new file, in a directory of its own in the
// box's /tmp, and returns its path in the box (see removeTemp).
func (c *CodeBox) writeTemp(ctx context.Context, name string, data []byte) (string, error) {
	dir := fmt.Sprintf("/tmp/.airlock-codebox/%d-%d", time.Now().UnixNano(), tempSeq.Add(1))
	p := path.Join(dir, name)
	return p, c.writeFile(ctx, p, data)
}

// removeTemp deletes the directory writeTemp made for p, so a long-lived
// CodeBox does not fill its disk with old scripts. Best effort.
func (c *CodeBox) removeTemp(p string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.box.Exec(ctx, "rm", []string{"-rf", path.Dir(p)}, airlock.ExecOptions{})
}

// writeFile writes data to path in the box, creating its directory.
func (c *CodeBox) writeFile(ctx context.Context, p string, data []byte) error {
	res, err := c.box.Exec(ctx, "sh", []string{"-c", `mkdir -p "$(dirname "$1")" && cat > "$1"`, "sh", p},
		airlock.ExecOptions{Stdin: bytes.NewReader(data)})
	if err != nil {
		return fmt.Errorf("codebox: write %s: %w", p, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("codebox: write %s: exit status %d: %s", p, res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}

// InstallPackage runs `python -m pip install pkg` in the box (pkg is any
// pip requirement: "requests", "numpy==1.26.4") and returns pip's stdout
// followed by its stderr. A failed install returns that
// output and an *ExecError. Options.IndexURL selects the package index.
func (c *CodeBox) InstallPackage(ctx context.Context, pkg string) (string, error) {
	return c.InstallPackages(ctx, pkg)
}

// InstallPackages installs several packages in one pip run; see
// InstallPackage. No packages is an error.
func (c *CodeBox) InstallPackages(ctx context.Context, pkgs ...string) (string, error) {
	if len(pkgs) == 0 {
		return "", errors.New("codebox: InstallPackages: no packages given")
	}
	args := []string{"-m", "pip", "install"}
	if u := c.opts.IndexURL; u != "" {
		args = append(args, "--index-url", u)
		if pu, err := url.Parse(u); err == nil && pu.Scheme == "http" && pu.Hostname() != "" {
			args = append(args, "--trusted-host", pu.Hostname())
		}
	}
	args = append(args, pkgs...)
	res, err := c.box.Exec(ctx, c.opts.Python, args, airlock.ExecOptions{
		Env:       []string{"PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_INPUT=1", "PIP_ROOT_USER_ACTION=ignore", "PIP_PROGRESS_BAR=off"},
		MaxOutput: c.opts.MaxOutput,
	})
	if err != nil {
		return "", fmt.Errorf("codebox: pip install: %w", err)
	}
	out := string(res.Stdout) + string(res.Stderr)
	if res.ExitCode != 0 || res.TimedOut {
		return out, &ExecError{ExitCode: res.ExitCode, Stdout: string(res.Stdout), Stderr: string(res.Stderr), TimedOut: res.TimedOut}
	}
	return out, nil
}

// Exec runs any command in the box; it is Box.Exec (a non-zero exit is in
// the result, not an error).
func (c *CodeBox) Exec(ctx context.Context, cmd string, args []string, opts airlock.ExecOptions) (*airlock.ExecResult, error) {
	return c.box.Exec(ctx, cmd, args, opts)
}
