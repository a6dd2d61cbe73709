// Command timeout shows an enforced time limit: an endless loop is killed
// after two seconds, with everything it started.
//
//	go run ./examples/timeout
//
// BoxLite's CodeBox.run accepts a timeout but does not enforce it (its docs
// send you to exec(timeout=...)). Here Options.Timeout, or a context
// deadline, bounds Run, and the error says it timed out.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
)

// run is main's body; it returns the exit status so that deferred
// clean-ups (removing the box) run before the process exits.
func run() int {
	ctx := context.Background()
	rt, err := airlock.Open(airlock.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "airlock:", err)
		return 1
	}
	defer rt.Close()
	cb, err := codebox.New(ctx, rt, codebox.Options{Timeout: 2 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "CodeBox failed to start:", err)
		return 1
	}
	defer cb.Close()

	start := time.Now()
	out, err := cb.Run(ctx, "print('looping forever', flush=True)\nwhile True: pass")
	var ee *codebox.ExecError
	if errors.As(err, &ee) && ee.TimedOut {
		fmt.Printf("stopped after %.1fs: %v (stdout so far: %q)\n", time.Since(start).Seconds(), err, out)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unexpected:", out, err)
	return 1
}

func main() { os.Exit(run()) }
