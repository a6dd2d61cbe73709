package e2b

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/codebox"
)

type discardCloser struct{ io.Writer }

func (discardCloser) Close() error { return nil }

// A bash context's streams are cut at its end lines wherever the reads
// split them: the output before them is the cell's, byte for byte (a UTF-8
// character split between reads included), and the stdout end line's
// status is the cell's.
func TestShellEndLines(t *testing.T) {
	sh := &shell{stdin: discardCloser{io.Discard}, token: "__airlock_cell_end_abc", chunks: make(chan shellChunk), quit: make(chan struct{})}
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	sh.readStreams(outR, errR)
	defer sh.once.Do(func() { close(sh.quit) })
	go func() {
		// Each write is one read: the end line and a 'é' arrive in pieces.
		for _, p := range []string{"one\ntwo \xc3", "\xa9 no newline", "__airlock_cel", "l_end_abc 3", "\n"} {
			outW.Write([]byte(p))
		}
		errW.Write([]byte("warn\n__airlock_cell_end_abc 0\n"))
	}()
	var out, errs strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	status, err := sh.run(ctx, "ignored", func(c codebox.Chunk) {
		if c.Stderr {
			errs.WriteString(c.Text)
		} else {
			out.WriteString(c.Text)
		}
	})
	if err != nil || status != 3 || out.String() != "one\ntwo é no newline" || errs.String() != "warn\n" {
		t.Fatalf("status %d, err %v, stdout %q, stderr %q", status, err, out.String(), errs.String())
	}
	// A marker with no status line after it is output.
	go outW.Write([]byte("x\n__airlock_cell_end_abc but not an end line at all\n__airlock_cell_end_abc 0\n"))
	go errW.Write([]byte("__airlock_cell_end_abc 0\n"))
	out.Reset()
	if _, err := sh.run(ctx, "ignored", func(c codebox.Chunk) { out.WriteString(c.Text) }); err != nil || out.String() != "x\n__airlock_cell_end_abc but not an end line at all\n" {
		t.Fatalf("stdout %q, err %v", out.String(), err)
	}
	// The streams end (bash exited): the run says so.
	outW.Close()
	errW.Close()
	if _, err := sh.run(ctx, "ignored", func(codebox.Chunk) {}); err != errShellGone {
		t.Fatalf("after bash exited: %v", err)
	}
}
