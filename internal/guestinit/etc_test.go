//go:build linux

package guestinit

import (
	"os"
	"path/filepath"
	"testing"
)

// rewrite leaves exactly the new content, whether the file held less, as
// much or more (a box may have appended to its /etc/hosts).
func TestRewriteReplacesContent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "hosts")
	for _, c := range []struct{ before, after string }{
		{"127.0.1.1\tabcdef\n", "127.0.1.1\tuvwxyz\n"},
		{"127.0.1.1\tabc\n", "127.0.1.1\tlonger-name\n"},
		{"127.0.1.1\tlonger-name\n10.0.0.9\tadded-by-the-box\n", "127.0.1.1\tx\n"},
	} {
		if err := os.WriteFile(p, []byte(c.before), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := rewrite(p, []byte(c.after)); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != c.after {
			t.Fatalf("after rewrite of %q with %q: %q", c.before, c.after, b)
		}
	}
	if err := rewrite(filepath.Join(t.TempDir(), "missing"), []byte("x")); err == nil {
		t.Fatal("rewrite of a missing file did not fail")
	}
}
