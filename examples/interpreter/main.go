// Command interpreter is BoxLite's "Build a code interpreter for your LLM"
// in Go: ask a model for code, run it in a microVM, print the result.
//
//	export OPENAI_API_KEY=...            # any value for an endpoint without keys
//	export OPENAI_BASE_URL=...           # optional: another OpenAI-compatible endpoint
//	export AIRLOCK_MODEL=gpt-4o-mini     # a model id your endpoint serves
//	go run ./examples/interpreter ["task"]
//
// The model's code never runs on this machine. `airlock ask` is the same
// loop as a command, plus a tool-calling mode with a stateful interpreter.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/interp"
)

func main() {
	task := "Compute the first 10 prime numbers and print them as a list."
	if len(os.Args) > 1 {
		task = strings.Join(os.Args[1:], " ")
	}
	// Reads OPENAI_API_KEY, OPENAI_BASE_URL and AIRLOCK_MODEL.
	llm, err := interp.NewOpenAI(interp.ConfigFromEnv(""))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx := context.Background()
	rt, err := airlock.Open(airlock.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "airlock:", err)
		os.Exit(1)
	}
	defer rt.Close()

	// The box is removed when main returns.
	cb, err := codebox.New(ctx, rt, codebox.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox failed to start:", err)
		os.Exit(1)
	}
	defer cb.Close()

	// 1) ask the model for code, 2) run it in the microVM, 3) print stdout.
	res, err := interp.OneShot(ctx, llm, cb, task)
	var ee *codebox.ExecError
	switch {
	case errors.As(err, &ee):
		fmt.Print(res.Output)
		fmt.Fprintf(os.Stderr, "the generated code failed:\n%s\n%s", res.Code, ee.Stderr)
	case err != nil:
		fmt.Fprintln(os.Stderr, err) // e.g. the endpoint does not serve the model
	default:
		fmt.Print(res.Output) // [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
		return
	}
	cb.Close() // deferred calls do not run on os.Exit
	rt.Close()
	os.Exit(1)
}
