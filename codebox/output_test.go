package codebox

import (
	"bufio"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/headtail"
)

// A cell printing far more than the cap keeps the head and tail of its
// output, with a marker line between them saying how much was left out;
// the interpreter goes on.
func TestKernelOutputFloodKeepsHeadAndTail(t *testing.T) {
	x := hostContext(t, time.Minute, time.Second)
	res := run(t, x, "import sys\nsys.stdout.write('H')\nfor _ in range(4096): sys.stdout.write('x' * 65536)\nsys.stdout.write('T')")
	const limit = 8 << 20
	marker := func(dropped int64) string {
		return fmt.Sprintf("\n[airlock: %d characters of stdout left out here]\n", dropped)
	}
	if !res.Truncated || res.StdoutDropped != 4096*65536+2-limit || len(res.Stdout) != limit+len(marker(res.StdoutDropped)) {
		t.Fatalf("kept %d, dropped %d, truncated %v", len(res.Stdout), res.StdoutDropped, res.Truncated)
	}
	if !strings.HasPrefix(res.Stdout, "Hx") || !strings.HasSuffix(res.Stdout, "xT") {
		t.Fatalf("head or tail lost")
	}
	if i := strings.Index(res.Stdout, marker(res.StdoutDropped)); i != limit/2 {
		t.Fatalf("marker at %d, want it between the head and the tail (at %d)", i, limit/2)
	}
	// fd-level output (subprocesses, C code) is cut the same way.
	res = run(t, x, "import os\nos.write(1, b'a' * (20 << 20) + b'Z')")
	if !res.Truncated || len(res.Stdout) != limit+len(marker(res.StdoutDropped)) || !strings.HasSuffix(res.Stdout, "aZ") ||
		!strings.Contains(res.Stdout, marker(res.StdoutDropped)) {
		t.Fatalf("fd-level flood: kept %d, dropped %d", len(res.Stdout), res.StdoutDropped)
	}
	// A cell printing without a newline is a normal cell.
	if res := run(t, x, "print('y' * 100, end='')"); res.Stdout != strings.Repeat("y", 100) || res.Truncated {
		t.Fatalf("no newline: %+v", res)
	}
}

// A cell that writes to the kernel's own protocol pipe, with no newline,
// cannot make the host read an unbounded line: the line is dropped as it
// is read, the interpreter restarted, and the next cell runs.
func TestKernelProtocolFloodIsBounded(t *testing.T) {
	x := hostContext(t, time.Minute, time.Second)
	res := run(t, x, "import os, sys\nfd = sys.modules['__main__']._proto_out.fileno()\nfor _ in range(40): os.write(fd, b'z' * (1 << 20))")
	if res.Error == nil || res.Error.Name != "ProtocolError" || !res.StateLost {
		t.Fatalf("protocol flood: %+v", res)
	}
	if res := run(t, x, "1 + 1"); res.Value != "2" {
		t.Fatalf("after a protocol flood: %+v", res)
	}
}

func TestReadMessageBoundsLines(t *testing.T) {
	r := bufio.NewReaderSize(strings.NewReader("short\n"+strings.Repeat("x", 1000)+"\nnext\nlast"), 16)
	for _, want := range []struct {
		line    string
		tooLong bool
	}{{"short\n", false}, {"", true}, {"next\n", false}, {"last", false}} {
		line, tooLong, _ := headtail.ReadLine(r, 100)
		if string(line) != want.line || tooLong != want.tooLong {
			t.Fatalf("got %q %v, want %q %v", line, tooLong, want.line, want.tooLong)
		}
	}
}
