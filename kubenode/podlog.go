package kubenode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"
)

// A pod's log file holds one record per line, as the CRI logs of a kubelet:
//
//	<RFC 3339 time, ns> <stdout|stderr> <F|P> <bytes>\n
//
// F ends a line of the container's output; P is part of a line that goes
// on in the next record of the stream (output without a newline yet, or a
// line longer than maxRecord). The times make `kubectl logs --timestamps`
// and `--since` possible.

// maxPodLogBytes bounds a pod's log file on the host (the box chooses how
// much it prints): past it the file is rotated to PATH.1, so a pod's
// logs take at most twice this.
const maxPodLogBytes = 16 << 20

// maxRecord bounds the bytes of output in one record; a longer line is
// written as several (P, ..., F), so that readers need a bounded buffer.
const maxRecord = 16 << 10

// maxTailLines bounds what `kubectl logs --tail` is honoured up to: a log
// holds far fewer lines than this (a record takes at least 40 bytes of
// the 2*maxPodLogBytes kept), so larger counts mean the whole log.
const maxTailLines = 1 << 20

// followPoll is how often a followed log is checked for new output.
const followPoll = 200 * time.Millisecond

// podLog serialises the container's output streams into one log file of
// at most max bytes, rotated as kubelet rotates container logs.
type podLog struct {
	mu   sync.Mutex
	f    *os.File // nil once a rotation failed: output is dropped
	path string
	size int64
	max  int64
	now  func() time.Time // for tests; default time.Now
}

// stream returns the writer of one output stream ("stdout" or "stderr").
func (l *podLog) stream(name string) io.Writer { return &streamWriter{l: l, name: name} }

type streamWriter struct {
	l    *podLog
	name string
}

// Write records b as F records for its complete lines and a P record for
// the rest. It never fails: output that cannot be kept is dropped (the
// box must not stall on its host's log).
func (w *streamWriter) Write(b []byte) (int, error) {
	all := len(b)
	for len(b) > 0 {
		n, tag := len(b), byte('P')
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			n, tag = i+1, 'F'
		}
		if n > maxRecord {
			n, tag = maxRecord, 'P'
		}
		line := b[:n]
		if tag == 'F' {
			line = line[:n-1]
		}
		w.l.record(w.name, tag, line)
		b = b[n:]
	}
	return all, nil
}

// record appends one record, rotating the file first when it would pass
// the bound.
func (l *podLog) record(stream string, tag byte, line []byte) {
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	rec := make([]byte, 0, len(line)+48)
	rec = now().UTC().AppendFormat(rec, time.RFC3339Nano)
	rec = append(rec, ' ')
	rec = append(rec, stream...)
	rec = append(rec, ' ', tag, ' ')
	rec = append(rec, line...)
	rec = append(rec, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	if l.size > 0 && l.size+int64(len(rec)) > l.max {
		l.f.Close()
		os.Rename(l.path, l.path+".1")
		f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			l.f = nil
			return
		}
		l.f, l.size = f, 0
	}
	n, _ := l.f.Write(rec)
	l.size += int64(n)
}

// Close closes the log file.
func (l *podLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// logRecord is one parsed record.
type logRecord struct {
	t      time.Time
	stream string
	full   bool // F: ends a line
	data   []byte
}

// parseRecord parses one record line (without its newline); ok is false
// for a line that is not a record.
func parseRecord(line []byte) (r logRecord, ok bool) {
	var f [3][]byte
	rest := line
	for i := range f {
		j := bytes.IndexByte(rest, ' ')
		if j < 0 {
			return r, false
		}
		f[i], rest = rest[:j], rest[j+1:]
	}
	t, err := time.Parse(time.RFC3339Nano, string(f[0]))
	if err != nil || len(f[2]) != 1 || (f[2][0] != 'F' && f[2][0] != 'P') {
		return r, false
	}
	return logRecord{t: t, stream: string(f[1]), full: f[2][0] == 'F', data: rest}, true
}

// logFile reads records from one open log file, remembering where the
// next one starts; a record not yet complete (no newline) is left for the
// next read.
type logFile struct {
	f   *os.File
	br  *bufio.Reader
	off int64 // offset of the next unread record
}

func openLogFile(path string) (*logFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return &logFile{f: f, br: bufio.NewReaderSize(f, maxRecord+256)}, nil
}

func (lf *logFile) close() {
	if lf != nil {
		lf.f.Close()
	}
}

func (lf *logFile) seek(off int64) error {
	if _, err := lf.f.Seek(off, io.SeekStart); err != nil {
		return err
	}
	lf.br.Reset(lf.f)
	lf.off = off
	return nil
}

// next returns the next complete record and its offset; io.EOF when none
// is complete yet. Lines that are no records (or too long to be) are
// skipped.
func (lf *logFile) next() (logRecord, int64, error) {
	for {
		line, err := lf.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Not a record of ours: skip to its end.
			lf.off += int64(len(line))
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = lf.br.ReadSlice('\n')
				lf.off += int64(len(line))
			}
			if err != nil {
				return logRecord{}, 0, err
			}
			continue
		}
		if err != nil {
			// An incomplete record: read it again once it is whole.
			if len(line) > 0 {
				if serr := lf.seek(lf.off); serr != nil {
					return logRecord{}, 0, serr
				}
			}
			return logRecord{}, 0, err
		}
		at := lf.off
		lf.off += int64(len(line))
		if r, ok := parseRecord(line[:len(line)-1]); ok {
			r.data = append([]byte(nil), r.data...)
			return r, at, nil
		}
	}
}

// logPos is a record's place: in the rotated file (rotated) or the
// current one, at off.
type logPos struct {
	rotated bool
	off     int64
}

// logStream reads a pod's log (PATH.1, then PATH) from where opts say
// (tail, since) and hands each record to emit; with follow it then waits
// for more until done() says the container has ended (and its output is
// all read) or ctx ends.
type logStream struct {
	path    string
	tail    int       // 0: all
	since   time.Time // zero: all
	follow  bool
	fromEnd bool        // start at the end (attach)
	done    func() bool // the container ended: no more output comes
	emit    func(logRecord) error
}

func (s *logStream) run(ctx context.Context) error {
	old, err := openLogFile(s.path + ".1")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	defer old.close()
	cur, err := openLogFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		cur = nil
	} else if err != nil {
		return err
	}
	defer func() { cur.close() }()

	start := logPos{rotated: old != nil}
	switch {
	case s.fromEnd:
		old.close()
		old = nil
		start = logPos{}
		if cur != nil {
			end, err := cur.f.Seek(0, io.SeekEnd)
			if err != nil {
				return err
			}
			start.off = end
		}
	case s.tail > 0:
		start, err = s.tailStart(old, cur)
		if err != nil {
			return err
		}
	}
	if start.rotated {
		if err := old.seek(start.off); err != nil {
			return err
		}
		if err := s.drain(old); err != nil {
			return err
		}
		start.off = 0
	}
	if cur != nil {
		if err := cur.seek(start.off); err != nil {
			return err
		}
	}
	for {
		if cur != nil {
			if err := s.drain(cur); err != nil {
				return err
			}
		}
		if !s.follow {
			return nil
		}
		// Rotated under us: what our file still holds, then the new one.
		if st, err := os.Stat(s.path); err == nil {
			if cur == nil || !sameFile(cur.f, st) {
				if cur != nil {
					if err := s.drain(cur); err != nil {
						return err
					}
					cur.close()
				}
				cur = nil
				if lf, err := openLogFile(s.path); err == nil {
					cur = lf
					continue
				}
			}
		}
		ended := s.done()
		if ended {
			// One last read: what was written before the end.
			if cur != nil {
				if err := s.drain(cur); err != nil {
					return err
				}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(followPoll):
		}
	}
}

func sameFile(f *os.File, st os.FileInfo) bool {
	fst, err := f.Stat()
	if err != nil {
		return false
	}
	a, ok1 := fst.Sys().(*syscall.Stat_t)
	b, ok2 := st.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && a.Ino == b.Ino && a.Dev == b.Dev
}

// drain emits every complete record left in lf.
func (s *logStream) drain(lf *logFile) error {
	for {
		r, _, err := lf.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if !s.since.IsZero() && r.t.Before(s.since) {
			continue
		}
		if err := s.emit(r); err != nil {
			return err
		}
	}
}

// tailStart finds where the last s.tail lines (since s.since) start: it
// reads both files once, keeping the places of the last s.tail line starts.
func (s *logStream) tailStart(old, cur *logFile) (logPos, error) {
	n := min(s.tail, maxTailLines)
	ring := make([]logPos, 0, min(n, 1024))
	head := 0 // ring[head] is the oldest once the ring is full
	lineStart := true
	scan := func(lf *logFile, rotated bool) error {
		if lf == nil {
			return nil
		}
		for {
			r, at, err := lf.next()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if lineStart && (s.since.IsZero() || !r.t.Before(s.since)) {
				p := logPos{rotated: rotated, off: at}
				if len(ring) < n {
					ring = append(ring, p)
				} else {
					ring[head] = p
					head = (head + 1) % n
				}
			}
			lineStart = r.full
		}
	}
	if err := scan(old, true); err != nil {
		return logPos{}, err
	}
	if err := scan(cur, false); err != nil {
		return logPos{}, err
	}
	if len(ring) == 0 {
		// Nothing to show: start at the end.
		if cur == nil {
			return logPos{rotated: old != nil, off: offEnd(old)}, nil
		}
		return logPos{off: cur.off}, nil
	}
	if len(ring) < n {
		return ring[0], nil
	}
	return ring[head], nil
}

func offEnd(lf *logFile) int64 {
	if lf == nil {
		return 0
	}
	return lf.off
}

// logWriter formats records for `kubectl logs`: the output as the
// container wrote it, each line prefixed by its time with timestamps, cut
// at limit bytes (0: no limit) — past it, errLogLimit ends the stream.
type logWriter struct {
	w          io.Writer
	timestamps bool
	limit      int64
	written    int64
	midLine    bool
}

var errLogLimit = errors.New("log limit reached")

func (lw *logWriter) emit(r logRecord) error {
	var b []byte
	if lw.timestamps && !lw.midLine {
		b = r.t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, ' ')
	}
	b = append(b, r.data...)
	if r.full {
		b = append(b, '\n')
	}
	lw.midLine = !r.full
	cut := false
	if lw.limit > 0 && lw.written+int64(len(b)) > lw.limit {
		b, cut = b[:lw.limit-lw.written], true
	}
	n, err := lw.w.Write(b)
	lw.written += int64(n)
	if err != nil {
		return err
	}
	if cut {
		return errLogLimit
	}
	return nil
}
