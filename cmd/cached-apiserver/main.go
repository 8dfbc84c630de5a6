// Command cached-apiserver serves fleet.example.com from etcd through its own
// watch cache. Run it with no flags for a standalone server on embedded etcd.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
	genericapiserver "k8s.io/apiserver/pkg/server"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/cli/globalflag"
	"k8s.io/component-base/logs"

	"github.com/cached-apiserver/cached-apiserver/pkg/cmd/server"
	"github.com/cached-apiserver/cached-apiserver/pkg/version"
)

const usage = `cached-apiserver serves fleet.example.com (Agents, Assignments) from etcd through its own watch cache.

With no flags it runs standalone: an embedded etcd, its own certificates and an admin kubeconfig under
.cached-apiserver/. With --mode=aggregated it runs behind a kube-apiserver's aggregator.

Usage:
  cached-apiserver [flags]
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command, returning its exit status: 0, 1 when the server
// fails, 2 for a bad command line.
func run(args []string, stdout, stderr io.Writer) int {
	logs.InitLogs()
	defer logs.FlushLogs()

	opts := server.NewOptions(stdout)
	fs := pflag.NewFlagSet("cached-apiserver", pflag.ContinueOnError)
	// The error is printed once, below; no usage dump after it.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fss := opts.AddFlags(fs)
	global := fss.FlagSet("global")
	globalflag.AddGlobalFlags(global, "cached-apiserver")
	showVersion := global.Bool("version", false, "Print the version and exit.")
	fs.AddFlagSet(global)

	if err := fs.Parse(args); err != nil {
		if err == pflag.ErrHelp {
			printUsage(stdout, fss)
			return 0
		}
		fmt.Fprintf(stderr, "cached-apiserver: %v (see --help)\n", err)
		return 2
	}
	if help, _ := fs.GetBool("help"); help {
		printUsage(stdout, fss)
		return 0
	}
	if *showVersion {
		fmt.Fprintf(stdout, "cached-apiserver %s\n", version.Version)
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cached-apiserver: unexpected arguments %q: it takes only flags (see --help)\n", fs.Args())
		return 2
	}
	if err := opts.Run(genericapiserver.SetupSignalContext()); err != nil {
		fmt.Fprintln(stderr, "cached-apiserver:", err)
		return 1
	}
	return 0
}

func printUsage(w io.Writer, fss cliflag.NamedFlagSets) {
	fmt.Fprint(w, usage)
	cliflag.PrintSections(w, fss, 100)
}
