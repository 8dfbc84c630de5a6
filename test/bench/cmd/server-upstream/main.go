// Command server-upstream is cached-apiserver with upstream's Cacher in
// place of ours, for the HTTP benchmark's comparison only. It is built by
// the benchmark and never shipped.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	genericapiserver "k8s.io/apiserver/pkg/server"

	"github.com/cached-apiserver/cached-apiserver/pkg/cmd/server"
)

func main() {
	opts := server.NewOptions(os.Stdout)
	fs := pflag.NewFlagSet("server-upstream", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	opts.StorageDecoratorOverride = genericregistry.StorageWithCacher()
	// Upstream as its users get it: the generic server's defaults, not
	// the serving path's settings ours turns on (issue 57).
	opts.WatchesOffChainStack = false
	if err := opts.Run(genericapiserver.SetupSignalContext()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
