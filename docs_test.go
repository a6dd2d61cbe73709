package airlock_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLimitsDocNamesRealTests checks that every test docs/limits.md names
// as showing a bound exists, so the page cannot point at a test that was
// renamed or removed.
func TestLimitsDocNamesRealTests(t *testing.T) {
	doc, err := os.ReadFile("docs/limits.md")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	re := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`)
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllSubmatch(src, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Z]\\w*)`").FindAllSubmatch(doc, -1)
	if len(named) < 40 {
		t.Fatalf("docs/limits.md names %d tests; expected its adversary tables", len(named))
	}
	for _, m := range named {
		if !defined[string(m[1])] {
			t.Errorf("docs/limits.md names %s, which no _test.go file defines", m[1])
		}
	}
}
