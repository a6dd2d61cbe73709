// Command install installs a package with pip inside a microVM, then uses
// it: BoxLite's "Install a package, then execute".
//
//	go run ./examples/install
//	go run ./examples/install -allow-net pypi.org:443,files.pythonhosted.org:443,api.github.com:443
//	go run ./examples/install -index-url http://host.airlock.internal:8080/simple/ -host-port 8080 -package mypkg -code 'import mypkg'
//
// The default installs requests from PyPI and fetches a page, so the box
// needs network access to PyPI and GitHub; -allow-net limits the box to
// those names. With -index-url pip uses that index instead; a server on
// the host's 127.0.0.1:8080 is host.airlock.internal:8080 in the box once
// -host-port 8080 opens it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
)

// run is main's body; it returns the exit status so that deferred
// clean-ups (removing the box) run before the process exits.
func run() int {
	indexURL := flag.String("index-url", "", "pip index URL (default PyPI)")
	allowNet := flag.String("allow-net", "", "comma-separated destinations the box may reach (default: the public internet)")
	hostPort := flag.Int("host-port", 0, "a port of the host's 127.0.0.1 the box may reach as host.airlock.internal")
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
	opts := codebox.Options{IndexURL: *indexURL}
	if *allowNet != "" {
		opts.AllowNet = strings.Split(*allowNet, ",")
	}
	if *hostPort != 0 {
		opts.AllowHostPorts = []int{*hostPort}
	}
	cb, err := codebox.New(ctx, rt, opts)
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
