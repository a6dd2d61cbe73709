package headtail

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// reference keeps head and tail the obvious way.
func reference(all []byte, max int) ([]byte, int64) {
	if len(all) <= max {
		return all, 0
	}
	tail := max / 2
	head := max - tail
	out := append(append([]byte(nil), all[:head]...), all[len(all)-tail:]...)
	return out, int64(len(all) - max)
}

func TestBufferMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, max := range []int{1, 2, 7, 64, 1000} {
		for trial := 0; trial < 200; trial++ {
			var all []byte
			b := NewBuffer(int64(max))
			for n := r.IntN(12); n > 0; n-- {
				chunk := make([]byte, r.IntN(3*max+2))
				for i := range chunk {
					chunk[i] = byte(r.Uint32())
				}
				all = append(all, chunk...)
				b.Write(chunk)
			}
			want, dropped := reference(all, max)
			if !bytes.Equal(b.Bytes(), want) || b.Dropped() != dropped {
				t.Fatalf("max %d, %d bytes in: kept %d bytes (dropped %d), want %d (dropped %d)",
					max, len(all), len(b.Bytes()), b.Dropped(), len(want), dropped)
			}
		}
	}
}

func TestUnlimitedBufferKeepsAll(t *testing.T) {
	b := NewBuffer(0)
	b.Write([]byte("abc"))
	b.Write([]byte("def"))
	if string(b.Bytes()) != "abcdef" || b.Dropped() != 0 {
		t.Fatalf("%q %d", b.Bytes(), b.Dropped())
	}
}

func TestLimiterHeadPassesAtOnce(t *testing.T) {
	l := NewLimiter(10)
	if h := l.Write([]byte("0123")); string(h) != "0123" {
		t.Fatalf("head %q", h)
	}
	if h := l.Write([]byte("456789abcdef")); string(h) != "4" {
		t.Fatalf("head %q", h)
	}
	if string(l.Tail()) != "bcdef" || l.Dropped() != 6 {
		t.Fatalf("tail %q dropped %d", l.Tail(), l.Dropped())
	}
}

func TestClipTextBoundsJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []string{"a", "\x00", "\n", "é", "\u2028", "\xff", "<", "日本"}
	for i := 0; i < 2000; i++ {
		var sb strings.Builder
		for n := rng.IntN(200); n > 0; n-- {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		s, max := sb.String(), rng.IntN(300)
		head, tail, dropped := ClipText(s, max)
		enc, _ := json.Marshal(head + tail)
		if len(enc)-2 > max && dropped > 0 {
			t.Fatalf("ClipText(%q, %d): %d bytes encoded", s, max, len(enc)-2)
		}
		if dropped == 0 && head != s {
			t.Fatalf("ClipText(%q, %d): nothing dropped but head %q", s, max, head)
		}
		if len(head)+len(tail)+dropped != len(s) || !strings.HasPrefix(s, head) || !strings.HasSuffix(s, tail) {
			t.Fatalf("ClipText(%q, %d) = %q, %q, %d", s, max, head, tail, dropped)
		}
		if JSONSize(s) < len(enc)-2 && dropped == 0 {
			t.Fatalf("JSONSize(%q) = %d, encoded %d", s, JSONSize(s), len(enc)-2)
		}
	}
	if h, tl, d := ClipText(strings.Repeat("\x00", 600), 120); d != 580 || len(h) != 10 || len(tl) != 10 {
		t.Errorf("NULs: head %d tail %d dropped %d, want 10 10 580", len(h), len(tl), d)
	}
}
