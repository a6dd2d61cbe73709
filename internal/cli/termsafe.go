package cli

import (
	"io"
	"unicode/utf8"

	"github.com/airlock-run/airlock"
)

// escapeWriter passes box output to a host terminal through
// airlock.EscapeConsole, as `logs --console` prints the console: control
// bytes (ESC, CSI, OSC 52 clipboard writes, title changes, cursor moves,
// a lone CR) and bytes that are not UTF-8 arrive as \xNN, so that code in
// a box cannot rewrite the user's terminal. It holds back at most the 3
// bytes of a UTF-8 sequence cut between two writes and the CR of a CRLF
// cut so; Flush writes them. One goroutine writes to it.
type escapeWriter struct {
	w    io.Writer
	pend []byte
}

// Write escapes p (with what an earlier write held back) to the terminal.
// It reports all of p written unless the terminal's write fails.
func (e *escapeWriter) Write(p []byte) (int, error) {
	b := append(e.pend, p...)
	keep := heldBack(b)
	out := airlock.EscapeConsole(string(b[:len(b)-keep]))
	e.pend = append(e.pend[:0:0], b[len(b)-keep:]...)
	if out == "" {
		return len(p), nil
	}
	if _, err := io.WriteString(e.w, out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what Write held back (escaped byte-wise when it stays
// incomplete).
func (e *escapeWriter) Flush() error {
	if len(e.pend) == 0 {
		return nil
	}
	out := airlock.EscapeConsole(string(e.pend))
	e.pend = nil
	_, err := io.WriteString(e.w, out)
	return err
}

// heldBack is how many bytes at the end of b may begin something the next
// write completes: a CR (of a CRLF) or an incomplete UTF-8 sequence.
func heldBack(b []byte) int {
	if n := len(b); n > 0 && b[n-1] == '\r' {
		return 1
	}
	for k := 1; k <= utf8.UTFMax-1 && k <= len(b); k++ {
		c := b[len(b)-k]
		if c < utf8.RuneSelf {
			return 0 // ASCII: nothing pending
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[len(b)-k:]) {
				return 0
			}
			return k
		}
	}
	return 0
}

// terminalSafe returns w itself when it is not a terminal (a pipe or a
// file gets the box's bytes unchanged), else an escapeWriter on it, whose
// Flush must be called once the output ends. Box output printed without -t
// goes through it: `exec` and `run` (the command's stdout and stderr),
// `logs` (the main command's log) and `top` (ps output, whose process
// names the box chooses). With -t the user asked for the box's terminal:
// its output reaches the host terminal raw, as with docker.
func terminalSafe(w io.Writer) (io.Writer, func() error) {
	if !isTerminal(w) {
		return w, func() error { return nil }
	}
	e := &escapeWriter{w: w}
	return e, e.Flush
}
