// Command airlock-net is a box's network helper: a user-mode TCP/IP stack
// that airlock starts for each running box with a network (see
// internal/netstack). QEMU's virtio-net device connects to it over a unix
// socket; it enforces the box's network policy, answers the box's DNS and
// forwards its published ports, and exits when the box's QEMU does.
package main

import (
	"os"

	"github.com/airlock-run/airlock/internal/netstack"
)

func main() { os.Exit(netstack.Main(os.Args[1:])) }
