// etcd's own server binary: the etcd/v3 module's main, on the pinned server module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
