// Command sample-apiserver is Kubernetes' sample-apiserver (the wardle
// API: Flunders and Fischers) serving every list and watch from
// cached-apiserver's watch cache instead of upstream's Cacher. It is
// sample-apiserver's own main and RunWardleServer with one line added,
// and the storage-readiness hook; see serve.
package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"
	"k8s.io/sample-apiserver/pkg/apiserver"
	"k8s.io/sample-apiserver/pkg/cmd/server"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

func main() {
	ctx := genericapiserver.SetupSignalContext()
	options := server.NewWardleServerOptions(os.Stdout, os.Stderr)
	os.Exit(cli.Run(newCommand(ctx, options)))
}

// newCommand is sample-apiserver's command, flags and all, running serve.
func newCommand(ctx context.Context, o *server.WardleServerOptions) *cobra.Command {
	cmd := server.NewCommandStartWardleServer(ctx, o, false)
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if err := o.Complete(); err != nil {
			return err
		}
		if err := o.Validate(args); err != nil {
			return err
		}
		return serve(c.Context(), o)
	}
	return cmd
}

// serve is sample-apiserver's RunWardleServer.
func serve(ctx context.Context, o *server.WardleServerOptions) error {
	config, err := o.Config()
	if err != nil {
		return err
	}

	// The one line: every resource's storage gets our cache. Scheme, the
	// one the server's codecs are made from, lets it decode in half the time.
	config.GenericConfig.RESTOptionsGetter = cacher.WithStorageDecorator(config.GenericConfig.RESTOptionsGetter,
		cacher.StorageDecorator(cacher.Config{Scheme: apiserver.Scheme}))

	srv, err := config.Complete().New()
	if err != nil {
		return err
	}
	// Not our cache's line, but what any aggregated server wants: /readyz
	// waits for every storage's cache to list, as kube-apiserver's does.
	// sample-apiserver, like the generic server, does not add the hook.
	srv.GenericAPIServer.AddPostStartHookOrDie("storage-readiness", srv.GenericAPIServer.StorageReadinessHook.Hook)
	srv.GenericAPIServer.AddPostStartHookOrDie("start-sample-server-informers", func(hook genericapiserver.PostStartHookContext) error {
		// Both are nil when the server runs without a core API (its test).
		if f := config.GenericConfig.SharedInformerFactory; f != nil {
			f.Start(hook.Done())
		}
		if o.SharedInformerFactory != nil {
			o.SharedInformerFactory.Start(hook.Done())
		}
		return nil
	})
	return srv.GenericAPIServer.PrepareRun().RunWithContext(ctx)
}
