package codebox

import (
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests drive the kernel script with the host's python3 (trusted
// test code only) so the protocol, interrupts and restarts are checked
// without booting a VM. box_test.go runs the same kernel in a box.

type hostProc struct {
	cmd            *exec.Cmd
	in             io.WriteCloser
	stdout, stderr io.Reader
}

func (p *hostProc) Stdin() io.WriteCloser         { return p.in }
func (p *hostProc) Stdout() io.Reader             { return p.stdout }
func (p *hostProc) Stderr() io.Reader             { return p.stderr }
func (p *hostProc) Signal(s syscall.Signal) error { return p.cmd.Process.Signal(s) }
func (p *hostProc) Kill() error                   { return p.cmd.Process.Kill() }
func (p *hostProc) Wait() (int, error) {
	err := p.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	return p.cmd.ProcessState.ExitCode(), err
}

func hostContext(t *testing.T, timeout, grace time.Duration) *Context {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed on the host")
	}
	script := filepath.Join(t.TempDir(), "kernel.py")
	if err := os.WriteFile(script, kernelSource, 0o644); err != nil {
		t.Fatal(err)
	}
	x := &Context{
		closing: make(chan struct{}),
		timeout: timeout,
		grace:   grace,
		start: func(ctx context.Context) (kernelProc, error) {
			cmd := exec.Command(py, "-u", script)
			cmd.Env = append(os.Environ(), "MPLBACKEND=Agg")
			in, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			errp, _ := cmd.StderrPipe()
			if err := cmd.Start(); err != nil {
				return nil, err
			}
			return &hostProc{cmd: cmd, in: in, stdout: out, stderr: errp}, nil
		},
	}
	if err := x.init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return x
}

func run(t *testing.T, x *Context, code string) *Result {
	t.Helper()
	res, err := x.Run(context.Background(), code)
	if err != nil {
		t.Fatalf("Run(%q): %v", code, err)
	}
	return res
}

func TestKernelHost(t *testing.T) {
	x := hostContext(t, 2*time.Second, time.Second)
	t.Run("state and last expression", func(t *testing.T) {
		run(t, x, "import math\ndef sq(v):\n    return v*v\nx = 41")
		res := run(t, x, "print('hi')\nsq(x) + math.floor(0.5)")
		if res.Stdout != "hi\n" || res.Value != "1681" || res.Error != nil {
			t.Fatalf("got %+v", res)
		}
		if res := run(t, x, "y = x + 1"); res.Value != "" {
			t.Fatalf("assignment has a value: %+v", res)
		}
		if res := run(t, x, "None"); res.Value != "" {
			t.Fatalf("None has a value: %+v", res)
		}
		if res := run(t, x, "'s'"); res.Value != "'s'" {
			t.Fatalf("repr: %+v", res)
		}
	})
	t.Run("exception keeps output", func(t *testing.T) {
		res := run(t, x, "import sys\nprint('before')\nprint('warn', file=sys.stderr)\n1/0\nprint('after')")
		if res.Stdout != "before\n" || res.Stderr != "warn\n" {
			t.Fatalf("output %+v", res)
		}
		e := res.Error
		if e == nil || e.Name != "ZeroDivisionError" || e.Value != "division by zero" ||
			!strings.Contains(e.Traceback, `File "<cell-`) || strings.Contains(e.Traceback, "kernel.py") {
			t.Fatalf("error %+v", e)
		}
	})
	t.Run("syntax error and SystemExit", func(t *testing.T) {
		if res := run(t, x, "def f(:"); res.Error == nil || res.Error.Name != "SyntaxError" {
			t.Fatalf("got %+v", res)
		}
		if res := run(t, x, "import sys; sys.exit(3)"); res.Error == nil || res.Error.Name != "SystemExit" {
			t.Fatalf("got %+v", res)
		}
		if res := run(t, x, "x"); res.Value != "41" {
			t.Fatalf("state lost after SystemExit: %+v", res)
		}
	})
	t.Run("subprocess output and stdin", func(t *testing.T) {
		res := run(t, x, "import os\nprint('py')\nos.system('echo sub; echo suberr >&2')\ninput()")
		if res.Stdout != "py\nsub\n" || res.Stderr != "suberr\n" || res.Error == nil || res.Error.Name != "EOFError" {
			t.Fatalf("got %+v", res)
		}
	})
	t.Run("timeout interrupts", func(t *testing.T) {
		res := run(t, x, "import time\nprint('start')\ntime.sleep(30)")
		if !res.TimedOut || res.StateLost || res.Error == nil || res.Error.Name != "KeyboardInterrupt" || res.Stdout != "start\n" {
			t.Fatalf("got %+v %+v", res, res.Error)
		}
		if res := run(t, x, "x"); res.Value != "41" {
			t.Fatalf("state lost after interrupt: %+v", res)
		}
	})
	t.Run("ignored interrupt restarts", func(t *testing.T) {
		res := run(t, x, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)")
		if !res.TimedOut || !res.StateLost || res.Error == nil || res.Error.Name != "TimeoutError" || !strings.Contains(res.Error.Value, "state was lost") {
			t.Fatalf("got %+v %+v", res, res.Error)
		}
		if res := run(t, x, "'x' in globals()"); res.Value != "False" {
			t.Fatalf("state kept after restart: %+v", res)
		}
		run(t, x, "x = 41")
	})
	t.Run("crash restarts", func(t *testing.T) {
		res := run(t, x, "import os; os._exit(7)")
		if !res.StateLost || res.Error == nil || res.Error.Name != "KernelDied" || !strings.Contains(res.Error.Value, "status 7") {
			t.Fatalf("got %+v %+v", res, res.Error)
		}
		if res := run(t, x, "1+1"); res.Value != "2" {
			t.Fatalf("after restart: %+v", res)
		}
	})
	t.Run("ctx cancel", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		res, err := x.Run(ctx, "import time; time.sleep(30)")
		if !errors.Is(err, context.DeadlineExceeded) || res == nil || !res.TimedOut {
			t.Fatalf("got %+v, %v", res, err)
		}
	})
	t.Run("close ends a running cell", func(t *testing.T) {
		y := hostContext(t, 0, time.Second)
		go func() { time.Sleep(300 * time.Millisecond); y.Close() }()
		if _, err := y.Run(context.Background(), "while True: pass"); !errors.Is(err, errClosed) {
			t.Fatalf("got %v", err)
		}
	})
}

// TestKernelDisplay: display() and a cell's value give the object's rich
// representations (IPython's _repr_*_ protocol), with the run's result
// and, when streamed, as the cell runs; an object whose _repr_html_
// raises, or that makes up attributes, has its repr only.
func TestKernelDisplay(t *testing.T) {
	x := hostContext(t, 10*time.Second, time.Second)
	run(t, x, `
class Rich:
    def __repr__(self): return "Rich()"
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_json_(self): return {"a": 1}
    def _repr_png_(self): return b"\x89PNG"
    def _repr_markdown_(self): return "**rich**"
class Broken:
    def __repr__(self): return "Broken()"
    def _repr_html_(self): raise ValueError("no")
class Liar:
    def __getattr__(self, name): return lambda *a, **k: "made up"
    def __repr__(self): return "Liar()"
`)
	res := run(t, x, "display(Rich(), Broken(), Liar())\nprint('after')\nRich()")
	if res.Error != nil || res.Stdout != "after\n" || len(res.Displays) != 3 {
		t.Fatalf("got %+v", res)
	}
	want := map[string]string{"text/plain": "Rich()", "text/html": "<b>rich</b>", "application/json": `{"a": 1}`,
		"image/png": "iVBORw==", "text/markdown": "**rich**"}
	if got := res.Displays[0].Data; !maps.Equal(got, want) {
		t.Errorf("display(Rich()): %v, want %v", got, want)
	}
	for i, name := range []string{"Broken()", "Liar()"} {
		if got := res.Displays[i+1].Data; len(got) != 1 || got["text/plain"] != name {
			t.Errorf("display(%s): %v, want its repr only", name, got)
		}
	}
	delete(want, "text/plain")
	if res.Value != "Rich()" || !maps.Equal(res.ValueData, want) {
		t.Errorf("value %q %v, want Rich() and %v", res.Value, res.ValueData, want)
	}
	if res := run(t, x, "41 + 1"); res.Value != "42" || res.ValueData != nil || res.Displays != nil {
		t.Errorf("a plain value: %+v", res)
	}
	var shown []*Display
	res, err := x.RunStream(context.Background(), "display(Rich())\nprint('x')", func(c Chunk) {
		if c.Display != nil {
			shown = append(shown, c.Display)
		}
	})
	if err != nil || res.Error != nil || len(res.Displays) != 0 || len(shown) != 1 || shown[0].Data["text/html"] != "<b>rich</b>" {
		t.Errorf("streamed display: %+v %v, shown %v", res, err, shown)
	}
}

// TestKernelStructured checks a Structured context's "e2b/data": a
// DataFrame's columns as JSON (NaN as null, dates in ISO form), none for
// a frame over the bounds or in a context that is not Structured. The
// host has no pandas: a stand-in module of that name gives the frames
// (box_test.go and internal/e2b's SDK tests use the real one).
func TestKernelStructured(t *testing.T) {
	fake := `
import sys, types, datetime
pd = types.ModuleType("pandas")
class DataFrame:
    def __init__(self, size, cols): self.size, self.cols = size, cols
    def __repr__(self): return "DataFrame()"
    def _repr_html_(self): return "<table/>"
    def to_dict(self, orient): return self.cols
pd.DataFrame = DataFrame
sys.modules["pandas"] = pd
small = DataFrame(3, {"a": [1, float("nan"), datetime.date(2024, 1, 2)], 2: ["x", None, True]})
big = DataFrame(200001, {"a": [1]})
`
	x := hostContext(t, 10*time.Second, time.Second)
	x.co.Structured = true
	run(t, x, fake)
	res := run(t, x, "display(small, big)\nsmall")
	if res.Error != nil || len(res.Displays) != 2 {
		t.Fatalf("got %+v", res)
	}
	const want = `{"a": [1, null, "2024-01-02"], "2": ["x", null, true]}`
	if got := res.Displays[0].Data[MIMEData]; got != want {
		t.Errorf("display(small)'s %s: %q, want %q", MIMEData, got, want)
	}
	if got := res.ValueData[MIMEData]; got != want || res.ValueData["text/html"] != "<table/>" {
		t.Errorf("the value's bundle: %v, want %s %q and its html", res.ValueData, MIMEData, want)
	}
	if d := res.Displays[1].Data; d[MIMEData] != "" || d["text/html"] != "<table/>" {
		t.Errorf("display(big): %v, want its html and no %s (over 200000 cells)", d, MIMEData)
	}
	plain := hostContext(t, 10*time.Second, time.Second)
	run(t, plain, fake)
	if res := run(t, plain, "small"); res.ValueData[MIMEData] != "" || res.ValueData["text/html"] != "<table/>" {
		t.Errorf("a context that is not Structured: %v, want no %s", res.ValueData, MIMEData)
	}
}
