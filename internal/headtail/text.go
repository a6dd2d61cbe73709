package headtail

import "unicode/utf8"

// runeJSONSize is how many bytes a JSON encoder may write for the first
// character of s (of size n bytes) inside a string: control characters
// as \uXXXX (6; \n, \t and the like 2), '"' and '\\' as 2, '<', '>' and
// '&' as 6 (encoders that escape HTML), U+2028 and U+2029 as 6, and an
// invalid byte as \ufffd (6). This is the most any of encoding/json's
// settings writes.
func runeJSONSize(r rune, n int) int {
	switch {
	case r == utf8.RuneError && n == 1:
		return 6
	case r == '\n' || r == '\r' || r == '\t' || r == '\b' || r == '\f' || r == '"' || r == '\\':
		return 2
	case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
		return 6
	}
	return n
}

// JSONSize returns the most bytes a JSON encoder writes for s as a string
// value, quotes not counted: a NUL byte costs 6 (\u0000), so output a box
// prints can take six times its size once encoded.
func JSONSize(s string) int {
	size := 0
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		size += runeJSONSize(r, n)
		i += n
	}
	return size
}

// ClipText cuts s so that its JSON encoding (JSONSize) fits in max bytes:
// it keeps a head and a tail of whole characters, each at most max/2
// encoded bytes, and returns them with the number of bytes of s dropped
// between them. When s fits whole, head is s, tail "" and dropped 0. The
// caller puts its own marker between head and tail (and leaves room for
// it).
func ClipText(s string, max int) (head, tail string, dropped int) {
	if max < 0 {
		max = 0
	}
	if len(s) <= max/6 || JSONSize(s) <= max {
		return s, "", 0
	}
	half := max / 2
	h, size := 0, 0
	for h < len(s) {
		r, n := utf8.DecodeRuneInString(s[h:])
		c := runeJSONSize(r, n)
		if size+c > half {
			break
		}
		size += c
		h += n
	}
	t, size := len(s), 0
	for t > h {
		r, n := utf8.DecodeLastRuneInString(s[:t])
		c := runeJSONSize(r, n)
		if size+c > max-half {
			break
		}
		size += c
		t -= n
	}
	return s[:h], s[t:], t - h
}
