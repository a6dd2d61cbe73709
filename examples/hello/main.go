// Command hello runs one line of Python in a microVM and prints its output:
// the Go version of BoxLite's CodeBox quick example.
//
//	go run ./examples/hello
//
// It needs what `airlock doctor` checks (QEMU, a guest kernel, the
// python:slim image, airlock-agent on PATH or in $AIRLOCK_AGENT).
package main

import (
	"context"
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

	// CodeBox defaults to the python:slim image; Close removes the box.
	cb, err := codebox.New(ctx, rt, codebox.Options{})
	if err != nil {
		// No QEMU or kernel, or the image is missing.
		fmt.Fprintln(os.Stderr, "CodeBox failed to start:", err)
		return 1
	}
	defer cb.Close()

	// Run hands the code to python3 -c inside the box and returns stdout.
	out, err := cb.Run(ctx, "print('Hello from a microVM!')")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Print(out) // Hello from a microVM!
	return 0
}

func main() { os.Exit(run()) }
