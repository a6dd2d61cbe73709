package cli

import (
	"fmt"
	"io"
	"os"
)

// quietFlag is the global --quiet flag.
var quietFlag bool

// quiet reports whether warnings are silenced (--quiet, AIRLOCK_QUIET=1).
func quiet() bool {
	if quietFlag {
		return true
	}
	switch os.Getenv("AIRLOCK_QUIET") {
	case "", "0", "false", "no":
		return false
	}
	return true
}

// warner returns the Options.Warn of the CLI: "airlock: warning: MSG" on
// w, unless quiet.
func warner(w io.Writer) func(string) {
	return func(msg string) {
		if !quiet() {
			fmt.Fprintln(w, "airlock: warning: "+msg)
		}
	}
}
