package vmm

import (
	"io"
	"os"
	"strings"

	"github.com/airlock-run/airlock/internal/guestabi"
)

// ConsoleTail returns the last n non-empty lines of a console log (read
// from at most its last 16 KiB), trailing spaces and CRs trimmed, each
// ending in a newline. A missing file gives "".
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
	for _, l := range strings.Split(string(b), "\n") {
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
