package airlock

import (
	"io"
	"strings"
	"unicode/utf8"
)

// EscapeConsole makes guest console text safe to show on a terminal: it
// keeps printable text, newlines and tabs, drops the carriage return of a
// CRLF, and writes every other control byte (C0, DEL, C1) and every byte
// that is not UTF-8 as \xNN, so that a guest cannot move the cursor,
// rewrite the screen or send terminal escape sequences through its log.
func EscapeConsole(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			writeHex(&b, s[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r == '\r' && i+1 < len(s) && s[i+1] == '\n':
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			for j := 0; j < n; j++ {
				writeHex(&b, s[i+j])
			}
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func writeHex(b *strings.Builder, c byte) {
	const hex = "0123456789abcdef"
	b.WriteString(`\x`)
	b.WriteByte(hex[c>>4])
	b.WriteByte(hex[c&15])
}

// CopyConsole copies a console log from r to w through EscapeConsole, in
// chunks (a UTF-8 sequence cut at a chunk boundary is escaped byte-wise).
func CopyConsole(w io.Writer, r io.Reader) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := io.WriteString(w, EscapeConsole(string(buf[:n]))); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
