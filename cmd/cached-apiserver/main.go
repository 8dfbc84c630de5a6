// Command cached-apiserver serves fleet.example.com from etcd through its own
// watch cache. Run it with no flags for a standalone server on embedded etcd.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli/globalflag"
	"k8s.io/component-base/logs"

	"github.com/cached-apiserver/cached-apiserver/pkg/cmd/server"
)

func main() {
	logs.InitLogs()
	defer logs.FlushLogs()

	opts := server.NewOptions(os.Stdout)
	fs := pflag.NewFlagSet("cached-apiserver", pflag.ContinueOnError)
	opts.AddFlags(fs)
	globalflag.AddGlobalFlags(fs, "cached-apiserver")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			return
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := opts.Run(genericapiserver.SetupSignalContext()); err != nil {
		fmt.Fprintln(os.Stderr, "cached-apiserver:", err)
		os.Exit(1)
	}
}
