package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/boxdir"
)

// The main command's output of a box is kept in its directory as JSON
// lines, as docker's json-file log driver writes them:
// {"log":"text\n","stream":"stdout","time":"2026-12-01T09:00:00.000000001Z"}.
// It is bounded: past logMaxBytes the file is moved to main.log.1
// (replacing the one before), so a box keeps at most twice that.
const (
	fileMainLog  = boxdir.MainLog
	logMaxBytes  = 8 << 20
	logLineLimit = 16 << 10 // a longer line is split into entries of this size
)

// logEntry is one line of a box's main log.
type logEntry struct {
	Log    string    `json:"log"`
	Stream string    `json:"stream"`
	Time   time.Time `json:"time"`
}

func boxDir(b *airlock.Box) string { return filepath.Dir(b.ConsoleLog()) }

// mainLog appends entries to a box's main log, rotating it at logMaxBytes.
type mainLog struct {
	mu   sync.Mutex
	path string
	f    *os.File
	size int64
}

func openMainLog(b *airlock.Box) (*mainLog, error) {
	p := filepath.Join(boxDir(b), fileMainLog)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	st, _ := f.Stat()
	l := &mainLog{path: p, f: f}
	if st != nil {
		l.size = st.Size()
	}
	return l, nil
}

func (l *mainLog) add(stream string, line []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	b, _ := json.Marshal(logEntry{Log: string(line), Stream: stream, Time: time.Now().UTC()})
	b = append(b, '\n')
	if l.size+int64(len(b)) > logMaxBytes {
		l.f.Close()
		os.Rename(l.path, l.path+".1")
		f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			l.f = nil
			return
		}
		l.f, l.size = f, 0
	}
	n, _ := l.f.Write(b)
	l.size += int64(n)
}

func (l *mainLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// streamWriter cuts one stream into lines for a mainLog.
type streamWriter struct {
	l      *mainLog
	stream string
	buf    []byte
}

func (w *streamWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 && len(w.buf) < logLineLimit {
			break
		}
		n := i + 1
		if i < 0 || n > logLineLimit {
			n = logLineLimit
		}
		w.l.add(w.stream, w.buf[:n])
		w.buf = w.buf[n:]
	}
	if len(w.buf) == 0 {
		w.buf = nil
	}
	return len(p), nil
}

// flush writes a last line without its newline.
func (w *streamWriter) flush() {
	if len(w.buf) > 0 {
		w.l.add(w.stream, w.buf)
		w.buf = nil
	}
}

// readLog returns the entries of a box's main log since the given time,
// oldest first, the last tail of them when tail >= 0; and the size of
// main.log read (to follow from).
func readLog(dir string, since time.Time, tail int) ([]logEntry, int64) {
	var out []logEntry
	var size int64
	for _, name := range []string{fileMainLog + ".1", fileMainLog} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		n, entries := scanLog(f, since)
		f.Close()
		out = append(out, entries...)
		if name == fileMainLog {
			size = n
		}
	}
	if tail >= 0 && len(out) > tail {
		out = out[len(out)-tail:]
	}
	return out, size
}

// scanLog reads complete entries from r; n is the bytes they took.
func scanLog(r io.Reader, since time.Time) (n int64, out []logEntry) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return n, out // a partial last line is read on the next poll
		}
		n += int64(len(line))
		var e logEntry
		if json.Unmarshal(line, &e) == nil && !e.Time.Before(since) {
			out = append(out, e)
		}
	}
}

// writeEntries prints entries, stdout's to out and stderr's to errw (each
// through terminalSafe where it is a terminal).
func writeEntries(out, errw io.Writer, entries []logEntry, timestamps bool) {
	for _, e := range entries {
		w := out
		if e.Stream == "stderr" {
			w = errw
		}
		if timestamps {
			fmt.Fprint(w, e.Time.Format(time.RFC3339Nano)+" ")
		}
		io.WriteString(w, e.Log)
	}
}

// parseSince reads --since: a duration before now (10m, 1h30m) or a time
// (RFC 3339, or 2006-01-02).
func parseSince(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration such as 10m, or a time such as 2026-01-02T15:04:05Z", s)
}

// tailLines returns the last n lines of text (all when n < 0).
func tailLines(text string, n int) string {
	if n < 0 {
		return text
	}
	lines := strings.SplitAfter(text, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

func newLogsCmd() *cobra.Command {
	var console, network, follow, timestamps bool
	var tail int
	var since string
	cmd := &cobra.Command{
		Use:   "logs [flags] BOX",
		Short: "Print the output of a box's main command (--console: its console)",
		Long: `Print the output of the box's main command: the command of 'airlock run',
'run -d' or 'create IMAGE COMMAND', stdout to stdout and stderr to stderr. Each
box keeps the last 8-16 MiB of it. --console prints the guest console instead
(kernel and agent messages of the current or last boot).

-f follows the output until the main command ends (or Ctrl-C); --tail N
starts from the last N lines; --since 10m (or a time) skips older lines.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sinceT, err := parseSince(since)
			if err != nil {
				return usagef(cmd, "logs: %v", err)
			}
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			if console {
				return consoleLogs(cmd, b, tail, follow)
			}
			// The box wrote this output (and the names in its network
			// log): a terminal gets it escaped, a pipe or file unchanged.
			out, flushOut := terminalSafe(cmd.OutOrStdout())
			errw, flushErr := terminalSafe(cmd.ErrOrStderr())
			defer flushErr()
			defer flushOut()
			if network {
				return printNetworkLog(out, b)
			}
			dir := boxDir(b)
			if _, err := os.Stat(filepath.Join(dir, fileMainLog)); err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "airlock: box %s has no main command output (it was created without a command); its console: airlock logs --console %s\n", b.ID(), args[0])
				return nil
			}
			entries, off := readLog(dir, sinceT, tail)
			writeEntries(out, errw, entries, timestamps)
			if !follow {
				return nil
			}
			return followLog(cmd, out, errw, b, dir, off, sinceT, timestamps)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&console, "console", false, "print the guest console (kernel and agent messages) instead")
	fl.BoolVar(&network, "network", false, "print the box's log of denied network attempts instead (time, protocol, destination, reason)")
	fl.BoolVarP(&follow, "follow", "f", false, "keep printing new output until the main command ends")
	fl.IntVarP(&tail, "tail", "n", -1, "print only the last N lines")
	fl.StringVar(&since, "since", "", "print only lines newer than this: a duration (10m) or a time (RFC 3339)")
	fl.BoolVarP(&timestamps, "timestamps", "t", false, "print the time of each line")
	return cmd
}

// mainDone reports whether the box's main command has ended (or the box
// stopped).
func mainDone(cmd *cobra.Command, b *airlock.Box) bool {
	info, err := b.Info(cmd.Context())
	if err != nil || info.State != airlock.BoxRunning {
		return true
	}
	_, err = os.Stat(filepath.Join(boxDir(b), fileMainDone))
	return err == nil
}

// followLog prints what is added to main.log from offset off until the
// main command ends or the command is interrupted.
func followLog(cmd *cobra.Command, out, errw io.Writer, b *airlock.Box, dir string, off int64, since time.Time, ts bool) error {
	p := filepath.Join(dir, fileMainLog)
	for {
		done := mainDone(cmd, b)
		f, err := os.Open(p)
		if err == nil {
			st, _ := f.Stat()
			if st != nil && st.Size() < off { // rotated
				off = 0
			}
			f.Seek(off, io.SeekStart)
			n, entries := scanLog(f, since)
			f.Close()
			off += n
			writeEntries(out, errw, entries, ts)
		}
		if done {
			return nil
		}
		select {
		case <-cmd.Context().Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// consoleLogs prints the box's console log (the last tail lines when tail
// >= 0), following it while the box runs with -f.
func consoleLogs(cmd *cobra.Command, b *airlock.Box, tail int, follow bool) error {
	f, err := os.Open(b.ConsoleLog())
	if err != nil {
		return fmt.Errorf("box %s has no console log yet (it has not booted)", b.ID())
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return err
	}
	// Escaped: the guest writes this log, and a terminal must not obey its
	// control sequences.
	io.WriteString(cmd.OutOrStdout(), airlock.EscapeConsole(tailLines(string(raw), tail)))
	for follow {
		info, err := b.Info(cmd.Context())
		if cerr := airlock.CopyConsole(cmd.OutOrStdout(), f); cerr != nil || err != nil || info.State != airlock.BoxRunning {
			return nil
		}
		// A confined box's log is a ring: at its cap its newest half moves
		// to its start; follow it from there.
		if fi, serr := f.Stat(); serr == nil {
			if pos, perr := f.Seek(0, io.SeekCurrent); perr == nil && fi.Size() < pos {
				f.Seek(0, io.SeekStart)
			}
		}
		select {
		case <-cmd.Context().Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}
