// Command etcd is etcd itself, built from the go.etcd.io/etcd/server/v3
// version the server requires, so that the benchmarks and the fault
// harness run etcd as separate processes with etcd's own flags
// (--name, --initial-cluster, --listen-client-urls, …) and can kill them.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
