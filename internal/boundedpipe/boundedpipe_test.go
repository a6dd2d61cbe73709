package boundedpipe

import (
	"bytes"
	"io"
	"testing"
)

// A writer ahead of its reader waits for it: everything arrives, in
// order, through a pipe smaller than the data.
func TestPipeCarriesMoreThanItsCapacity(t *testing.T) {
	r, w := New(7)
	want := bytes.Repeat([]byte("0123456789"), 1000)
	go func() {
		for i := 0; i < len(want); i += 13 {
			w.Write(want[i:min(i+13, len(want))])
		}
		w.CloseWrite()
	}()
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes (%v), want %d", len(got), err, len(want))
	}
}

// Once the reader is gone, writes are dropped (reported written), so the
// exec feeding the pipe never stalls; what was buffered can still be read.
func TestClosedReaderDropsWrites(t *testing.T) {
	r, w := New(4)
	w.Write([]byte("abcd"))
	r.(io.Closer).Close()
	if n, err := w.Write([]byte("more than the pipe holds")); n != 24 || err != nil {
		t.Errorf("Write after the reader closed: %d %v", n, err)
	}
	w.CloseWrite()
	if got, err := io.ReadAll(r); string(got) != "abcd" || err != nil {
		t.Errorf("buffered data: %q %v", got, err)
	}
}

// DropWrites frees a writer blocked on a full pipe.
func TestDropWritesFreesABlockedWriter(t *testing.T) {
	r, w := New(2)
	done := make(chan int)
	go func() {
		n, _ := w.Write([]byte("abcdef"))
		done <- n
	}()
	buf := make([]byte, 2)
	if n, _ := io.ReadFull(r, buf); n != 2 {
		t.Fatalf("read %d", n)
	}
	w.DropWrites()
	if n := <-done; n != 6 {
		t.Errorf("blocked Write returned %d, want 6", n)
	}
}
