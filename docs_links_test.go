package airlock_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// mdLink matches an inline markdown link or image: [text](target) or
// [text](target "title").
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestDocsLinksResolve checks that every relative link in README.md and
// docs/ names a file or folder of the repository and, where it carries a
// #fragment into a markdown file, a heading of that file (GitHub's anchors).
func TestDocsLinksResolve(t *testing.T) {
	files := []string{"README.md"}
	err := filepath.WalkDir("docs", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(p string) map[string]bool {
		if a, ok := anchors[p]; ok {
			return a
		}
		a := headingAnchors(t, p)
		anchors[p] = a
		return a
	}
	checked := 0
	for _, f := range files {
		for _, l := range markdownLinks(t, f) {
			target := l.target
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			resolved := f
			if path != "" {
				resolved = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", f, l.line, target, resolved)
					continue
				}
			}
			checked++
			if frag == "" || !strings.HasSuffix(resolved, ".md") {
				continue
			}
			if !anchorsOf(resolved)[frag] {
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", f, l.line, target, resolved, frag)
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked only %d relative links in %d files: is the link pattern broken?", checked, len(files))
	}
}

type mdLinkAt struct {
	target string
	line   int
}

// markdownLinks lists the links of file f outside fenced code blocks and
// inline code spans.
func markdownLinks(t *testing.T, f string) []mdLinkAt {
	t.Helper()
	var out []mdLinkAt
	forEachProseLine(t, f, func(n int, line string) {
		for _, m := range mdLink.FindAllStringSubmatch(stripCodeSpans(line), -1) {
			out = append(out, mdLinkAt{m[1], n})
		}
	})
	return out
}

// headingAnchors returns the anchors GitHub gives the headings of file f:
// lower case, punctuation dropped, spaces as hyphens, -1, -2... for repeats.
func headingAnchors(t *testing.T, f string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	seen := map[string]int{}
	forEachProseLine(t, f, func(_ int, line string) {
		if !strings.HasPrefix(line, "#") {
			return
		}
		text := strings.TrimLeft(line, "#")
		if len(text) == len(line) || !strings.HasPrefix(text, " ") {
			return
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(text)) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if k := seen[a]; k > 0 {
			out[a+"-"+strconv.Itoa(k)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	})
	return out
}

// forEachProseLine calls fn with each line of f (1-based) that is not in a
// fenced code block.
func forEachProseLine(t *testing.T, f string, fn func(n int, line string)) {
	t.Helper()
	fh, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	fence := false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if !fence {
			fn(n, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", f, err)
	}
}

// stripCodeSpans removes `code` spans, whose brackets are not links.
func stripCodeSpans(line string) string {
	parts := strings.Split(line, "`")
	var b strings.Builder
	for i, p := range parts {
		if i%2 == 0 {
			b.WriteString(p)
		}
	}
	return b.String()
}
