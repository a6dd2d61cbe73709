package airlock_test

import (
	"testing"

	"github.com/airlock-run/airlock"
)

func TestEscapeConsole(t *testing.T) {
	for in, want := range map[string]string{
		"plain text\n":              "plain text\n",
		"tab\tok\r\n":               "tab\tok\n",
		"\x1b[2Jclear":              `\x1b[2Jclear`,
		"bell\a and \rovertype":     `bell\x07 and \x0dovertype`,
		"utf-8 é ✓":                 "utf-8 é ✓",
		"bad \xff byte, C1 \u009b[": `bad \xff byte, C1 \xc2\x9b[`,
		"del\x7f":                   `del\x7f`,
	} {
		if got := airlock.EscapeConsole(in); got != want {
			t.Errorf("EscapeConsole(%q) = %q, want %q", in, got, want)
		}
	}
}
