package guestabi

import (
	"strings"
	"testing"
)

func TestBoxHostname(t *testing.T) {
	for _, c := range []struct{ hostname, name, id, want string }{
		{"web-1", "named", "0123456789ab", "web-1"},
		{"", "named", "0123456789ab", "named"},
		{"", "my_box", "0123456789ab", "0123456789ab"}, // '_' is no host name's
		{"", "", "0123456789ab", "0123456789ab"},
		{"", strings.Repeat("a", 64), "0123456789ab", "0123456789ab"},
	} {
		if got := BoxHostname(c.hostname, c.name, c.id); got != c.want {
			t.Errorf("BoxHostname(%q, %q, %q) = %q, want %q", c.hostname, c.name, c.id, got, c.want)
		}
	}
	for s, want := range map[string]bool{"a-B-9": true, strings.Repeat("x", 63): true, strings.Repeat("x", 64): false, "a.b": false, "a b": false, "é": false} {
		if ValidHostname(s) != want {
			t.Errorf("ValidHostname(%q) = %v", s, !want)
		}
	}
}
