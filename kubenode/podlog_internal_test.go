package kubenode

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestPodLogBounded: a pod that prints without end takes at most twice
// the bound on the host's disk (the log and its one rotation), and the
// newest output is what the log holds.
func TestPodLogBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "uid.log")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	l := &podLog{f: f, path: p, max: 1000}
	line := bytes.Repeat([]byte("y"), 99)
	line = append(line, '\n')
	for i := 0; i < 1000; i++ {
		if n, err := l.Write(line); n != len(line) || err != nil {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
	}
	if n, err := l.Write(append(bytes.Repeat([]byte("x"), 5000), "end\n"...)); n != 5004 || err != nil {
		t.Fatalf("write past the bound: %d, %v", n, err)
	}
	l.Close()
	var total int64
	for _, q := range []string{p, p + ".1"} {
		st, err := os.Stat(q)
		if err != nil {
			t.Fatal(err)
		}
		total += st.Size()
	}
	if total > 2000 {
		t.Errorf("log and rotation hold %d bytes after 100 kB of output, want at most 2000", total)
	}
	b, _ := os.ReadFile(p)
	if !bytes.HasSuffix(b, []byte("xend\n")) {
		t.Errorf("the log does not end with the newest output: %q", b[max(0, len(b)-20):])
	}
}
