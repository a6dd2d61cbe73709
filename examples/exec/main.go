// Command exec runs code that raises and reads its exit code, stdout and
// stderr: BoxLite's "Need both stdout and stderr / check the exit code".
//
//	go run ./examples/exec
//
// Exec returns the exit code and both streams, and a non-zero exit is a
// result, not an error. Unlike BoxLite's run(), CodeBox.Run does not hide
// the failure either: it returns an *codebox.ExecError with the same fields.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

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
	cb, err := codebox.New(ctx, rt, codebox.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "CodeBox failed to start:", err)
		return 1
	}
	defer cb.Close()

	// Intentionally run code that raises.
	res, err := cb.Exec(ctx, "python3", []string{"-c", "print('working'); raise ValueError('boom')"}, airlock.ExecOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("exit_code:", res.ExitCode) // 1
	fmt.Printf("stdout: %s", res.Stdout)    // working
	fmt.Printf("stderr: %s", res.Stderr)    // the traceback

	// The same through Run: stdout plus an error that carries the rest.
	out, err := cb.Run(ctx, "print('working'); raise ValueError('boom')")
	var ee *codebox.ExecError
	if errors.As(err, &ee) {
		fmt.Printf("Run: stdout %q, exit code %d, error: %v\n", out, ee.ExitCode, err)
	}
	return 0
}

func main() { os.Exit(run()) }
