package boundedio

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadFileBound(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f.json")
	os.WriteFile(p, []byte("12345"), 0o600)
	if b, err := ReadFile(p, 5); err != nil || string(b) != "12345" {
		t.Fatalf("at the bound: %q %v", b, err)
	}
	_, err := ReadFile(p, 4)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "f.json") || !strings.Contains(err.Error(), "4 bytes") {
		t.Fatalf("past the bound: %v", err)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "none"), 4); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
}
