package codebox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// chunks records what RunStream passes on.
type chunks struct{ out, err []string }

func (c *chunks) add(ch Chunk) {
	if ch.Stderr {
		c.err = append(c.err, ch.Text)
	} else {
		c.out = append(c.out, ch.Text)
	}
}

// A streamed cell's output reaches the callback while the cell runs: the
// cell waits (up to a minute) for a file the callback makes once it has
// seen both streams' first lines. The chunks, joined, are the Result's
// output, fd-level output included.
func TestRunStreamPassesOutputOnWhileTheCellRuns(t *testing.T) {
	x := hostContext(t, 2*time.Minute, 5*time.Second)
	gate := filepath.Join(t.TempDir(), "go")
	var got chunks
	sawOut, sawErr := false, false
	code := fmt.Sprintf(`import os, sys, time
print("first")
print("oops", file=sys.stderr)
for _ in range(600):
    if os.path.exists(%q): break
    time.sleep(0.1)
else:
    raise TimeoutError("the host never saw the first lines")
print("second")
os.system("echo from-a-subprocess")
"done"`, gate)
	res, err := x.RunStream(context.Background(), code, func(c Chunk) {
		got.add(c)
		sawOut = sawOut || (!c.Stderr && c.Text == "first\n")
		sawErr = sawErr || (c.Stderr && c.Text == "oops\n")
		if sawOut && sawErr {
			os.WriteFile(gate, nil, 0o644)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Error != nil || res.Value != "'done'" {
		t.Fatalf("cell: %+v", res)
	}
	if want := "first\nsecond\nfrom-a-subprocess\n"; res.Stdout != want || strings.Join(got.out, "") != want {
		t.Fatalf("stdout %q, chunks %q; want %q", res.Stdout, got.out, want)
	}
	if res.Stderr != "oops\n" || strings.Join(got.err, "") != "oops\n" {
		t.Fatalf("stderr %q, chunks %q", res.Stderr, got.err)
	}
	// Run still answers with the whole output, nothing streamed.
	if res := run(t, x, "print('a'); print('b')"); res.Stdout != "a\nb\n" {
		t.Fatalf("Run after RunStream: %q", res.Stdout)
	}
}

// A streamed flood keeps the same head, note and tail as Run's, and the
// chunks stay bounded in size.
func TestRunStreamFloodIsBounded(t *testing.T) {
	x := hostContext(t, time.Minute, time.Second)
	var got chunks
	biggest := 0
	res, err := x.RunStream(context.Background(), "import sys\nsys.stdout.write('H')\nfor _ in range(4096): sys.stdout.write('x' * 65536)\nsys.stdout.write('T')", func(c Chunk) {
		got.add(c)
		biggest = max(biggest, len(c.Text))
	})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 8 << 20
	note := fmt.Sprintf("\n[airlock: %d characters of stdout left out here]\n", res.StdoutDropped)
	if !res.Truncated || res.StdoutDropped != 4096*65536+2-limit || len(res.Stdout) != limit+len(note) ||
		!strings.HasPrefix(res.Stdout, "Hx") || !strings.HasSuffix(res.Stdout, "xT") || strings.Index(res.Stdout, note) != limit/2 {
		t.Fatalf("kept %d, dropped %d, truncated %v", len(res.Stdout), res.StdoutDropped, res.Truncated)
	}
	if strings.Join(got.out, "") != res.Stdout {
		t.Fatalf("the chunks (%d) are not the output", len(got.out))
	}
	if biggest > 1<<20 {
		t.Fatalf("a chunk of %d bytes", biggest)
	}
}

// A cell interrupted while it streams (SIGINT lands while the kernel
// writes its protocol lines) stops with KeyboardInterrupt, keeps what it
// printed, and the interpreter's protocol is intact: its state survives.
func TestRunStreamInterruptKeepsTheProtocol(t *testing.T) {
	x := hostContext(t, 2*time.Second, 30*time.Second)
	run(t, x, "kept = 7")
	n := 0
	res, err := x.RunStream(context.Background(), "while True: print('x' * 100)", func(c Chunk) { n++ })
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.StateLost || res.Error == nil || res.Error.Name != "KeyboardInterrupt" || n == 0 ||
		!strings.HasPrefix(res.Stdout, strings.Repeat("x", 100)+"\n") {
		t.Fatalf("interrupted stream: %d chunks, %+v", n, res.Error)
	}
	if res := run(t, x, "kept + 1"); res.Value != "8" {
		t.Fatalf("after the interrupt: %+v", res)
	}
}

// A figure a streamed cell shows (plt.show()) comes as the cell runs (the
// cell waits for a file the callback makes on it), rendered and closed;
// the figures left open at the end are the Result's. A stand-in pyplot
// (no matplotlib on the host needed) renders "PNG n".
func TestRunStreamShowsFiguresAsTheCellRuns(t *testing.T) {
	x := hostContext(t, 2*time.Minute, 5*time.Second)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "matplotlib"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "matplotlib", "__init__.py"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "matplotlib", "pyplot.py"), []byte(`
_open = []
class _Fig:
    def __init__(self, n): self.n = n
    def savefig(self, buf, **kw): buf.write(b"PNG %d" % self.n)
def plot(n): _open.append(n)
def get_fignums(): return list(_open)
def figure(n): return _Fig(n)
def close(which): _open.clear()
def show(*a, **k): pass
`), 0o644)
	gate := filepath.Join(dir, "go")
	var shown []string
	res, err := x.RunStream(context.Background(), fmt.Sprintf(`import os, sys, time
sys.path.insert(0, %q)
import matplotlib.pyplot as plt
plt.plot(1)
plt.show()
for _ in range(600):
    if os.path.exists(%q): break
    time.sleep(0.1)
else:
    raise TimeoutError("the figure did not come while the cell ran")
plt.plot(2)`, dir, gate), func(c Chunk) {
		if c.Image != nil {
			shown = append(shown, string(c.Image.Data))
			os.WriteFile(gate, nil, 0o644)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Error != nil || len(shown) != 1 || shown[0] != "PNG 1" || len(res.Images) != 1 || string(res.Images[0].Data) != "PNG 2" {
		t.Fatalf("shown %q, result images %d, error %v", shown, len(res.Images), res.Error)
	}
	// Run (not streamed): show() is pyplot's own, the figures come at the end.
	if res := run(t, x, "plt.plot(3)\nplt.show()"); len(res.Images) != 1 || string(res.Images[0].Data) != "PNG 3" {
		t.Fatalf("Run: %d images", len(res.Images))
	}
}
