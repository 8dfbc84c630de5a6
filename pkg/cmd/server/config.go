package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	goruntime "runtime"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/healthz"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/utils/clock"
	netutils "k8s.io/utils/net"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/apiserver"
	fleetopenapi "github.com/cached-apiserver/cached-apiserver/pkg/generated/openapi"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

// embedded reports whether the server runs its own etcd: no --etcd-servers.
func (o *Options) embedded() bool {
	return len(o.Recommended.Etcd.StorageConfig.Transport.ServerList) == 0
}

// pki is standalone mode's certificate directory.
func (o *Options) pki() standalonePKI { return standalonePKI{dir: filepath.Join(o.DataDir, "pki")} }

// KubeconfigPath is where standalone mode writes the admin kubeconfig.
func (o *Options) KubeconfigPath() string { return filepath.Join(o.DataDir, kubeconfigName) }

// Config builds the server config. The etcd endpoints must be known.
func (o *Options) Config() (*apiserver.Config, error) {
	standalone := o.Mode == ModeStandalone
	if standalone {
		if err := o.pki().ensure([]string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}); err != nil {
			return nil, fmt.Errorf("creating certificates in %s: %w", o.pki().dir, err)
		}
		cert := &o.Recommended.SecureServing.ServerCert.CertKey
		if cert.CertFile == "" {
			cert.CertFile, cert.KeyFile = o.pki().path(servingCert), o.pki().path(servingKeyFile)
		}
	} else if err := o.Recommended.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil,
		[]net.IP{netutils.ParseIPSloppy("127.0.0.1")}); err != nil {
		return nil, fmt.Errorf("creating self-signed certificates: %w", err)
	}

	serverConfig := genericapiserver.NewRecommendedConfig(apiserver.Codecs)
	namer := openapi.NewDefinitionNamer(apiserver.Scheme)
	serverConfig.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(fleetopenapi.GetOpenAPIDefinitions, namer)
	serverConfig.OpenAPIConfig.Info.Title = "cached-apiserver"
	serverConfig.OpenAPIConfig.Info.Version = "v1beta1"
	serverConfig.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(fleetopenapi.GetOpenAPIDefinitions, namer)
	serverConfig.OpenAPIV3Config.Info.Title = "cached-apiserver"
	serverConfig.OpenAPIV3Config.Info.Version = "v1beta1"

	maxWatches := o.MaxWatches
	var authReady *apiserver.AuthenticationReady // set below, once authentication is configured
	serverConfig.BuildHandlerChainFunc = func(h http.Handler, c *genericapiserver.Config) http.Handler {
		// The watch limit and the shared gzip of watch-lists and lists
		// innermost, so that the request is authenticated and its info
		// known, and a list's headers are those the handler sends; the wait
		// for the client CAs outside the chain.
		inner := apiserver.WithWatchLimit(apiserver.WithWatchListGzip(apiserver.WithListGzip(h, newListGzipStream), newGzipStream), maxWatches, c.Serializer)
		chain := authReady.WithAuthenticationReady(genericapiserver.DefaultBuildHandlerChain(inner, c))
		if !c.ShutdownSendRetryAfter {
			return chain
		}
		// Outermost, so that a stopping server's 429 says Retry-After: 1
		// before the generic chain's says 5.
		return apiserver.WithShutdownRetryAfter(chain, apiserver.ShutdownRetryAfterConfig{Initiated: c.ShutdownInitiatedNotify(),
			Delay: c.ShutdownDelayDuration, Serializer: c.Serializer, Clock: clock.RealClock{}})
	}

	// ServerRun first: the feature options read the max-in-flight limits it sets.
	if err := o.ServerRun.ApplyTo(&serverConfig.Config); err != nil {
		return nil, err
	}
	// Serving and its loopback client first, as the recommended options
	// would, and then the rest of them without it (applySecureServing).
	if err := applySecureServing(o.Recommended.SecureServing, &serverConfig.Config, clock.RealClock{}); err != nil {
		return nil, err
	}
	rest := *o.Recommended
	rest.SecureServing = nil
	// The etcd health and readiness checks' clients, like the stores'
	// (StorageDecorator), dial a refused member again every second.
	etcd := *rest.Etcd
	cacher.RedialEtcd(&etcd.StorageConfig.Transport)
	rest.Etcd = &etcd
	if err := rest.ApplyTo(serverConfig); err != nil {
		return nil, err
	}
	if standalone {
		if err := o.applyStandaloneAuth(&serverConfig.Config); err != nil {
			return nil, err
		}
	}
	// Requests wait for the CA they are authenticated with, and /readyz
	// fails until it is loaded: the front-proxy CA behind a kube-apiserver.
	authCA := serverConfig.SecureServing.ClientCA
	if rh := serverConfig.Authentication.RequestHeaderConfig; rh != nil {
		authCA = rh.CAContentProvider
	}
	authReady = apiserver.NewAuthenticationReady(apiserver.AuthenticationReadyConfig{CA: authCA, Serializer: serverConfig.Serializer})
	serverConfig.AddReadyzChecks(authReady.Check())
	sizes, err := genericoptions.ParseWatchCacheSizes(o.Recommended.Etcd.WatchCacheSizes)
	if err != nil {
		return nil, fmt.Errorf("--watch-cache-sizes: %w", err)
	}
	o.shutdown = cacher.NewShutdown()
	// The storage-readiness hook lets /readyz pass after
	// --storage-initialization-timeout whether or not the caches are ready;
	// ours refuse reads until then (cacher.Initialized).
	o.initialized = cacher.NewInitialized()
	initialized := o.initialized
	if !inject.On(inject.ReadyzWithoutCache) {
		serverConfig.AddReadyzChecks(healthz.NamedCheck("watch-cache-initialized", func(*http.Request) error { return initialized.Check() }))
	}
	decorator := apiserver.StorageDecorator(o.watchCacheOptions(sizes))
	if o.StorageDecoratorOverride != nil {
		decorator = o.StorageDecoratorOverride
	}
	return &apiserver.Config{
		GenericConfig: serverConfig,
		ExtraConfig:   apiserver.ExtraConfig{StorageDecorator: decorator},
	}, nil
}

// applyStandaloneAuth authenticates client certificates signed by our CA and
// authorizes system:masters. Anonymous requests get 401; other users get 403.
func (o *Options) applyStandaloneAuth(c *genericapiserver.Config) error {
	ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca", o.pki().path(caCertFile))
	if err != nil {
		return err
	}
	if err := c.Authentication.ApplyClientCert(ca, c.SecureServing); err != nil {
		return err
	}
	c.Authentication.Authenticator = x509.NewDynamic(ca.VerifyOptions, x509.CommonNameUserConversion)
	c.Authorization.Authorizer = authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup)
	return nil
}

// defaultInitialEventsConcurrency is twice the CPUs this process may use:
// see --watch-cache-initial-events-concurrency. Once initial events were
// written from the cached bytes, 10 watch-lists of 100,000 objects on 2
// CPUs ended 2.2 times as soon at 4 as at 1, with writes' p99 beside them
// about the same; with no bound, writes' p99 was 5 times as long
// (standalone). Behind kube-apiserver with priority and fairness, 4 lists
// beside 100 watch-lists ended about 10 times as soon with it (make
// bench-gates; docs/benchmarks.md).
func defaultInitialEventsConcurrency() int { return 2 * goruntime.GOMAXPROCS(0) }

// watchCacheOptions is what the watch-cache flags set, for the cache of
// every resource.
func (o *Options) watchCacheOptions(sizes map[schema.GroupResource]int) apiserver.WatchCacheOptions {
	return apiserver.WatchCacheOptions{
		Shutdown:                 o.shutdown,
		Initialized:              o.initialized,
		Enabled:                  o.Recommended.Etcd.EnableWatchCache,
		ConsistentReadFallback:   o.ConsistentReadFallback,
		ConsistencyCheckInterval: o.ConsistencyCheckInterval,
		WarmStartRevisions:       o.WarmStartRevisions,
		HistoryBudget:            o.HistoryBudget.Value(),
		Compression:              cacher.Compression(o.Compression),
		InitialEventsConcurrency: o.InitialEventsConcurrency,
		Sizes:                    sizes,
	}
}

// newGzipStream is the cache's GzipStream for a watch-list's response.
func newGzipStream(w io.Writer) apiserver.GzipStream { return cacher.NewGzipStream(w) }

// newListGzipStream is the cache's GzipStream for a list's response.
func newListGzipStream(w io.Writer) registry.GzipItemStream { return cacher.NewGzipStream(w) }
