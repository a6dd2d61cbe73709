package airlock

import (
	"io"

	"github.com/airlock-run/airlock/internal/vmm"
)

// EscapeConsole makes guest console text safe to show on a terminal: it
// keeps printable text, newlines and tabs, drops the carriage return of a
// CRLF, and writes every other control byte (C0, DEL, C1) and every byte
// that is not UTF-8 as \xNN, so that a guest cannot move the cursor,
// rewrite the screen or send terminal escape sequences through its log.
// Console tails in errors (DiedError) are escaped already.
func EscapeConsole(s string) string { return vmm.EscapeConsole(s) }

// CopyConsole copies a console log from r to w through EscapeConsole, in
// chunks (a UTF-8 sequence cut at a chunk boundary is escaped byte-wise).
func CopyConsole(w io.Writer, r io.Reader) error { return vmm.CopyConsole(w, r) }
