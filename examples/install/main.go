// Command install installs a package with pip inside a microVM, then uses
// it: BoxLite's "Install a package, then execute".
//
//	go run ./examples/install
//	go run ./examples/install -index-url http://10.0.2.2:8080/simple/ -package mypkg -code 'import mypkg'
//
// The default installs requests from PyPI and fetches a page, so the box
// needs network access to PyPI and GitHub. With -index-url pip uses that
// index instead; the box sees the host's loopback as 10.0.2.2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
)

// run is main's body; it returns the exit status so that deferred
// clean-ups (removing the box) run before the process exits.
func run() int {
	indexURL := flag.String("index-url", "", "pip index URL (default PyPI)")
	pkg := flag.String("package", "requests", "package to install")
	code := flag.String("code", "import requests; print(requests.get('https://api.github.com/zen').text)", "code to run after the install")
	flag.Parse()

	ctx := context.Background()
	rt, err := airlock.Open(airlock.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "airlock:", err)
		return 1
	}
	defer rt.Close()
	cb, err := codebox.New(ctx, rt, codebox.Options{IndexURL: *indexURL})
	if err != nil {
		fmt.Fprintln(os.Stderr, "CodeBox failed to start:", err)
		return 1
	}
	defer cb.Close()

	// pip install inside the box; its output is pip's stdout + stderr.
	if out, err := cb.InstallPackage(ctx, *pkg); err != nil {
		fmt.Fprint(os.Stderr, out)
		fmt.Fprintln(os.Stderr, "pip install failed:", err)
		return 1
	}
	out, err := cb.Run(ctx, *code)
	fmt.Print(out)
	var ee *codebox.ExecError
	if errors.As(err, &ee) {
		fmt.Fprint(os.Stderr, ee.Stderr) // the traceback
		return 1
	} else if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func main() { os.Exit(run()) }
