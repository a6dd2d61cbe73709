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
