package vmm

import (
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/airlock-run/airlock/internal/guestabi"
)

// ConsoleTail returns the last n non-empty lines of a console log (read
// from at most its last 16 KiB), trailing spaces and CRs trimmed, control
// bytes escaped (EscapeConsole), each ending in a newline. A missing file
// gives "".
func ConsoleTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 16 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		f.Seek(st.Size()-window, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, window))
	var lines []string
	for _, l := range strings.Split(EscapeConsole(string(b)), "\n") {
		if l = strings.TrimRight(l, "\r "); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}

// GuestCause reads why a guest ended from its console text: a kernel
// panic (with its message), the guest out of memory, or the agent failing
// to set the box up. It returns "" when the console says none of these.
func GuestCause(console string) string {
	switch {
	case strings.Contains(console, "Kernel panic"):
		for _, l := range strings.Split(console, "\n") {
			if i := strings.Index(l, "Kernel panic"); i >= 0 {
				return "guest kernel panic (" + strings.TrimSpace(l[i:]) + ")"
			}
		}
	case strings.Contains(console, "Out of memory"):
		return "the guest ran out of memory"
	case strings.Contains(console, guestabi.FatalPrefix):
		return "the guest agent failed to set up the box"
	}
	return ""
}

// DeathFromConsole classifies a death from the console log at path: the
// guest's cause if the console names one, else fallback.
func DeathFromConsole(path, fallback string) Death {
	cause := GuestCause(ConsoleTail(path, 400))
	if cause == "" {
		cause = fallback
	}
	return Death{Cause: cause, ConsoleTail: ConsoleTail(path, 25)}
}

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
// chunks of 64 KiB (a UTF-8 sequence cut at a chunk boundary is escaped
// byte-wise).
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
