// Command airlock is the airlock CLI: run untrusted code in microVMs.
// See `airlock --help` and the README.
package main

import (
	"os"

	"github.com/airlock-run/airlock/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
