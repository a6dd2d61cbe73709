package kubenode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// newTestLog returns a pod log of at most max bytes in a temporary
// directory whose records carry the times clock returns.
func newTestLog(t *testing.T, max int64, clock func() time.Time) *podLog {
	t.Helper()
	p := filepath.Join(t.TempDir(), "uid.log")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	l := &podLog{f: f, path: p, max: max, now: clock}
	t.Cleanup(func() { l.Close() })
	return l
}

// readLog runs a logStream over l's file and returns what kubectl logs
// would print.
func readLog(t *testing.T, l *podLog, s logStream, timestamps bool, limit int64) string {
	t.Helper()
	var b bytes.Buffer
	lw := &logWriter{w: &b, timestamps: timestamps, limit: limit}
	s.path, s.emit = l.path, lw.emit
	if s.done == nil {
		s.done = func() bool { return true }
	}
	if err := s.run(context.Background()); err != nil && err != errLogLimit {
		t.Fatal(err)
	}
	return b.String()
}

// TestPodLogBounded: a pod that prints without end takes at most twice
// the bound on the host's disk (the log and its one rotation), and the
// newest output is what the log holds; a line longer than a record comes
// back whole.
func TestPodLogBounded(t *testing.T) {
	l := newTestLog(t, 100<<10, nil)
	out := l.stream("stdout")
	line := append(bytes.Repeat([]byte("y"), 99), '\n')
	for i := 0; i < 10000; i++ {
		if n, err := out.Write(line); n != len(line) || err != nil {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
	}
	long := append(bytes.Repeat([]byte("x"), 3*maxRecord+5), "end\n"...)
	if n, err := out.Write(long); n != len(long) || err != nil {
		t.Fatalf("a long line: %d, %v", n, err)
	}
	var total int64
	for _, q := range []string{l.path, l.path + ".1"} {
		st, err := os.Stat(q)
		if err != nil {
			t.Fatal(err)
		}
		total += st.Size()
	}
	if total > 200<<10 {
		t.Errorf("log and rotation hold %d bytes after 1 MB of output, want at most %d", total, 200<<10)
	}
	got := readLog(t, l, logStream{tail: 1}, false, 0)
	if got != string(long) {
		t.Errorf("tail 1 = %d bytes ending %q, want the long line (%d bytes)", len(got), got[max(0, len(got)-10):], len(long))
	}
}

// TestPodLogOptions: tail, since, timestamps, limitBytes, and output
// without a newline, over the rotated file and the current one.
func TestPodLogOptions(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var tick atomic.Int64
	clock := func() time.Time { return t0.Add(time.Duration(tick.Load()) * time.Second) }
	l := newTestLog(t, 200, clock)
	out, errw := l.stream("stdout"), l.stream("stderr")
	for i := 0; i < 10; i++ {
		tick.Store(int64(i))
		w := out
		if i%2 == 1 {
			w = errw
		}
		fmt.Fprintf(w, "line %d\n", i)
	}
	tick.Store(10)
	fmt.Fprint(out, "partial ")
	fmt.Fprint(out, "end\n")
	if _, err := os.Stat(l.path + ".1"); err != nil {
		t.Fatalf("the log was not rotated (test too small?): %v", err)
	}
	all := readLog(t, l, logStream{}, false, 0)
	// The rotation keeps the newest lines only: check the tail of it.
	if !strings.HasSuffix(all, "line 8\nline 9\npartial end\n") {
		t.Errorf("all = %q", all)
	}
	if got := readLog(t, l, logStream{tail: 2}, false, 0); got != "line 9\npartial end\n" {
		t.Errorf("tail 2 = %q", got)
	}
	if got := readLog(t, l, logStream{since: t0.Add(9 * time.Second)}, false, 0); got != "line 9\npartial end\n" {
		t.Errorf("since = %q", got)
	}
	if got := readLog(t, l, logStream{tail: 1}, true, 0); got != "2026-01-02T03:04:15Z partial end\n" {
		t.Errorf("timestamps = %q", got)
	}
	if got := readLog(t, l, logStream{tail: 2}, false, 4); got != "line" {
		t.Errorf("limitBytes 4 = %q", got)
	}
	if got := readLog(t, l, logStream{tail: 1 << 40}, false, 0); got != all {
		t.Errorf("a huge tail = %q, want all", got)
	}
}

// TestPodLogFollow: a followed log delivers output written later, across
// a rotation, and ends once the container has ended.
func TestPodLogFollow(t *testing.T) {
	l := newTestLog(t, 600, nil)
	out := l.stream("stdout")
	fmt.Fprint(out, "before\n")
	var ended atomic.Bool
	pr, pw := newPipe()
	s := logStream{path: l.path, follow: true, done: ended.Load, emit: (&logWriter{w: pw}).emit}
	errc := make(chan error, 1)
	go func() { errc <- s.run(context.Background()) }()
	pr.expect(t, "before\n")
	for i := 0; i < 15; i++ { // 15 records of ~50 bytes: rotates once
		fmt.Fprintf(out, "more %d\n", i)
	}
	var want strings.Builder
	for i := 0; i < 15; i++ {
		fmt.Fprintf(&want, "more %d\n", i)
	}
	pr.expect(t, want.String())
	if _, err := os.Stat(l.path + ".1"); err != nil {
		t.Fatalf("the log was not rotated: %v", err)
	}
	ended.Store(true)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follow did not end after the container ended")
	}
}

// pipe collects what a logWriter writes, for expect.
type pipe struct {
	mu  chan struct{}
	buf *bytes.Buffer
}

func newPipe() (*pipe, *pipe) {
	p := &pipe{mu: make(chan struct{}, 1), buf: &bytes.Buffer{}}
	return p, p
}

func (p *pipe) Write(b []byte) (int, error) {
	p.mu <- struct{}{}
	defer func() { <-p.mu }()
	return p.buf.Write(b)
}

// expect waits until the output so far starts with want, and consumes it.
func (p *pipe) expect(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu <- struct{}{}
		got := p.buf.String()
		if strings.HasPrefix(got, want) {
			p.buf.Next(len(want))
			<-p.mu
			return
		}
		<-p.mu
		if time.Now().After(deadline) {
			t.Fatalf("followed output = %q, want %q", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
