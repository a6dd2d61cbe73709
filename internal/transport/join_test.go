package transport

import (
	"bytes"
	"io"
	"testing"
)

// writes records each Write it gets, as the port or socket would.
type writes struct {
	io.ReadWriteCloser
	got [][]byte
}

func (w *writes) Write(p []byte) (int, error) {
	w.got = append(w.got, bytes.Clone(p))
	return len(p), nil
}

// A data frame's header and small body go out in one write; a window
// update, a ping, a data frame without a body and a large body's header go
// out at once, each alone; the bytes and their order are yamux's.
func TestJoinWriterJoinsHeaderAndBody(t *testing.T) {
	w := &writes{}
	j := newJoinWriter(w)
	body := []byte("hello")
	big := bytes.Repeat([]byte{7}, joinMax+1)
	steps := [][]byte{
		yamuxFrame(yamuxTypeData, yamuxFlagSYN, 1, uint32(len(body)), nil), body,
		yamuxFrame(1, 0, 1, 4096, nil), // window update: no body
		yamuxFrame(yamuxTypePing, 0, 0, 9, nil),
		yamuxFrame(yamuxTypeData, 4, 1, 0, nil), // FIN, no body
		yamuxFrame(yamuxTypeData, 0, 3, uint32(len(big)), nil), big,
	}
	var all []byte
	for _, p := range steps {
		n, err := j.Write(p)
		if err != nil || n != len(p) {
			t.Fatalf("Write of %d bytes: %d, %v", len(p), n, err)
		}
		all = append(all, p...)
	}
	if len(w.got) != 6 {
		t.Fatalf("%d writes, want 6 (header and body joined once)", len(w.got))
	}
	if len(w.got[0]) != yamuxHeader+len(body) {
		t.Errorf("first write has %d bytes, want the header and its body (%d)", len(w.got[0]), yamuxHeader+len(body))
	}
	if got := bytes.Join(w.got, nil); !bytes.Equal(got, all) {
		t.Error("the bytes written differ from yamux's")
	}
}

// A held header followed by something other than its body (yamux never
// does this) still goes out first, alone.
func TestJoinWriterUnexpectedBody(t *testing.T) {
	w := &writes{}
	j := newJoinWriter(w)
	h := yamuxFrame(yamuxTypeData, 0, 1, 5, nil)
	j.Write(h)
	j.Write([]byte("abc"))
	if len(w.got) != 2 || !bytes.Equal(w.got[0], h) || string(w.got[1]) != "abc" {
		t.Fatalf("writes %q", w.got)
	}
}
