package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"

	genericapiserver "k8s.io/apiserver/pkg/server"

	"github.com/cached-apiserver/cached-apiserver/pkg/apiserver"
)

// Instance is a configured server, ready to run.
type Instance struct {
	// URL is where the server serves, with the real port.
	URL string
	// Kubeconfig is the admin kubeconfig's path; empty in aggregated mode.
	Kubeconfig string
	// EtcdEndpoints are the etcd client URLs the server stores in.
	EtcdEndpoints []string

	server *apiserver.Server
	etcd   *embeddedEtcd
}

// NewInstance completes, validates and builds the server, starting the
// embedded etcd if no --etcd-servers were given.
func (o *Options) NewInstance() (*Instance, error) {
	if err := o.Complete(); err != nil {
		return nil, err
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	inst := &Instance{}
	if o.embedded() {
		e, err := o.EmbeddedEtcd.start(o.DataDir)
		if err != nil {
			return nil, err
		}
		inst.etcd = &e
		// The listener address lacks a scheme; etcd's client wants a URL.
		o.Recommended.Etcd.StorageConfig.Transport.ServerList = []string{"http://" + e.Clients[0].Addr().String()}
	}
	inst.EtcdEndpoints = o.Recommended.Etcd.StorageConfig.Transport.ServerList
	cfg, err := o.Config()
	if err != nil {
		inst.closeEtcd()
		return nil, err
	}
	addr := cfg.GenericConfig.SecureServing.Listener.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	inst.URL = (&url.URL{Scheme: "https", Host: net.JoinHostPort(host, strconv.Itoa(addr.Port))}).String()
	if o.Mode == ModeStandalone {
		inst.Kubeconfig = o.KubeconfigPath()
		if err := o.pki().writeKubeconfig(inst.Kubeconfig, inst.URL); err != nil {
			inst.closeEtcd()
			return nil, fmt.Errorf("writing kubeconfig: %w", err)
		}
	}
	srv, err := cfg.Complete().New()
	if err != nil {
		inst.closeEtcd()
		return nil, err
	}
	inst.server = srv
	out := o.Out
	srv.GenericAPIServer.AddPostStartHookOrDie("cached-apiserver-banner", func(genericapiserver.PostStartHookContext) error {
		if out != nil {
			inst.printBanner(out)
		}
		return nil
	})
	shutdown := o.shutdown
	srv.GenericAPIServer.AddPreShutdownHookOrDie("cached-apiserver-bookmark-watchers", func() error {
		// The generic server ends every watch once its hooks return; give
		// the bookmarks a moment to be written first.
		ctx, cancel := context.WithTimeout(context.Background(), shutdownBookmarkWait)
		defer cancel()
		shutdown.Begin(ctx)
		return nil
	})
	if informers := cfg.GenericConfig.SharedInformerFactory; informers != nil {
		srv.GenericAPIServer.AddPostStartHookOrDie("start-cached-apiserver-informers", func(ctx genericapiserver.PostStartHookContext) error {
			informers.Start(ctx.Done())
			return nil
		})
	}
	return inst, nil
}

// Run serves until ctx is done, lets open watches drain for the termination
// grace period, then stops the embedded etcd.
func (i *Instance) Run(ctx context.Context) error {
	defer i.closeEtcd()
	return i.server.GenericAPIServer.PrepareRun().RunWithContext(ctx)
}

func (i *Instance) closeEtcd() {
	if i.etcd != nil {
		i.etcd.Close()
		i.etcd = nil
	}
}

func (i *Instance) printBanner(out io.Writer) {
	fmt.Fprintf(out, "\ncached-apiserver is serving fleet.example.com on %s\n", i.URL)
	if i.Kubeconfig == "" {
		return
	}
	fmt.Fprintf(out, "  kubeconfig: %s\n  try:        kubectl --kubeconfig %s get assignments -A\n\n",
		i.Kubeconfig, i.Kubeconfig)
}

// Run is the whole command: parse nothing, build the instance and serve.
func (o *Options) Run(ctx context.Context) error {
	inst, err := o.NewInstance()
	if err != nil {
		return err
	}
	return inst.Run(ctx)
}
