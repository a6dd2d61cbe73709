// Command etcd is etcd's server, built from go.etcd.io/etcd/server/v3 at the
// version hack/kube/go.mod pins, for the loopback control plane of
// hack/kube-up.sh (Debian's etcd is too old for Kubernetes 1.37).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
