package qemu

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDrainConsoleKeepsTheNewest: past its cap the log keeps its newest
// part, so it never grows beyond the cap and the last line is there.
func TestDrainConsoleKeepsTheNewest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	var in bytes.Buffer
	for i := 0; i < 100000; i++ {
		fmt.Fprintf(&in, "line %d of a flooding guest\n", i)
	}
	const max = 64 << 10
	drainConsole(&in, path, max)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > max || len(b) < max/4 {
		t.Fatalf("log is %d bytes, want at most the cap %d (and its newest part)", len(b), max)
	}
	if !strings.HasSuffix(string(b), "line 99999 of a flooding guest\n") {
		t.Fatalf("newest line missing: ...%q", b[len(b)-60:])
	}
}

func TestHeadTailKeepsBothEnds(t *testing.T) {
	h := &headTail{max: 8}
	for _, s := range []string{"0123", "4567", "89ab", "cdef", "ghij"} {
		h.Write([]byte(s))
	}
	if got, want := h.String(), "01234567\n[... 4 bytes ...]\ncdefghij"; got != want {
		t.Fatalf("kept %q, want %q", got, want)
	}
	small := &headTail{max: 8}
	small.Write([]byte("abc"))
	if got := small.String(); got != "abc" {
		t.Fatalf("kept %q", got)
	}
}
