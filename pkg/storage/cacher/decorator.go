package cacher

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/etcdconn"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// StorageDecorator returns a generic.StorageDecorator that wraps each
// resource's etcd3 storage in a Cacher: the entry point for any generic
// apiserver. base carries the tunables (a zero Config takes every
// default); the resource-specific fields are filled from what the registry
// passes, and a KeyReader for the consistency check unless base turns the
// check off. WithStorageDecorator puts it in a server's RESTOptionsGetter;
// examples/sample-apiserver serves the wardle API that way.
//
// With base.Scheme set, the etcd3 store each cache wraps decodes with
// object.NewStorageCodec: the same objects, decoded in half the time.
//
// Each resource's etcd connections, its etcd3 store's and its cache's
// own, are dialled through an etcdconn.Tracker of its own, wrapping the
// transport's EgressLookup if it has one, so that a cache whose etcd watch
// went silent closes its resource's quiet connections, and its next watch
// and requests reach a member that answers. No other resource's
// connection is touched. The tracker dials a refused member again within
// each of gRPC's connection attempts (RedialEtcd).
func StorageDecorator(base Config) generic.StorageDecorator {
	return func(
		config *storagebackend.ConfigForResource,
		resourcePrefix string,
		keyFunc func(obj runtime.Object) (string, error),
		newFunc func() runtime.Object,
		newListFunc func() runtime.Object,
		getAttrsFunc storage.AttrFunc,
		triggerFuncs storage.IndexerFuncs,
		indexers *cache.Indexers,
	) (storage.Interface, factory.DestroyFunc, error) {
		transport := config.Transport
		RedialEtcd(&transport)
		dial, err := transport.EgressLookup(egressselector.Etcd.AsNetworkContext())
		if err != nil {
			return nil, nil, fmt.Errorf("etcd dialer of %s: %w", config.GroupResource, err)
		}
		tracker := etcdconn.New(etcdconn.Config{Dial: dial})
		tracked := *config
		tracked.Transport.EgressLookup = tracker.Lookup
		if base.Scheme != nil {
			// The etcd3 store decodes what the cache lists and watches
			// with it: faster, to the same objects.
			tracked.Codec = object.NewStorageCodec(config.Codec, base.Scheme, newFunc)
		}
		raw, destroyRaw, err := generic.NewRawStorage(&tracked, newFunc, newListFunc, resourcePrefix)
		if err != nil {
			return nil, nil, err
		}
		cfg := base
		cfg.Storage = raw
		cfg.GroupResource = config.GroupResource
		cfg.ResourcePrefix = resourcePrefix
		cfg.KeyFunc = keyFunc
		cfg.Codec = config.Codec
		cfg.NewFunc = newFunc
		cfg.NewListFunc = newListFunc
		if base.Scheme != nil {
			// The cache's own lists keep the bytes the store decoded, and
			// its objects' bytes are written from them, not encoded again.
			cfg.NewListFunc = object.NewStoredList
		}
		cfg.GetAttrsFunc = getAttrsFunc
		cfg.IndexerFuncs = triggerFuncs
		cfg.Indexers = indexers
		if cfg.Connections == nil {
			cfg.Connections = tracker
		}
		client, err := newEtcdClient(config.Transport, tracker)
		if err != nil {
			destroyRaw()
			return nil, nil, fmt.Errorf("etcd client of the watch cache of %s: %w", config.GroupResource, err)
		}
		closeClient := func() { _ = client.Close() }
		cfg.Client, cfg.StoragePrefix, cfg.Transformer = client, config.Prefix, config.Transformer
		if cfg.KeyReader == nil && cfg.ConsistencyCheckInterval >= 0 {
			cfg.KeyReader = NewEtcdKeyReader(client, config.Prefix, resourcePrefix)
		}
		c, err := New(cfg)
		if err != nil {
			closeClient()
			destroyRaw()
			return nil, nil, err
		}
		return c, func() { c.Stop(); closeClient(); destroyRaw() }, nil
	}
}

// RedialEtcd makes every etcd client the generic storage factory builds
// from t, such as the etcd health and readiness checks' clients, dial a
// member that refuses, or does not answer within 2 s, again, about every
// second, within each of gRPC's connection attempts, instead of waiting out gRPC's growing backoff
// between attempts, whose settings the factory does not let us set. After
// a member's 54 s outage the readiness check's client reached it 12 s
// after its return; with RedialEtcd, within about a second. It wraps t's
// EgressLookup, if it has one. StorageDecorator does the same for each
// resource's etcd3 store and cache; a server calls RedialEtcd on its
// EtcdOptions' StorageConfig.Transport before applying them.
func RedialEtcd(t *storagebackend.TransportConfig) {
	lookup := t.EgressLookup
	t.EgressLookup = func(nc egressselector.NetworkContext) (utilnet.DialFunc, error) {
		var dial utilnet.DialFunc
		if lookup != nil {
			var err error
			if dial, err = lookup(nc); err != nil {
				return nil, err
			}
		}
		return etcdconn.Redial(dial, nil), nil
	}
}

// Connection settings of the consistency check's etcd client, as the
// generic storage factory's (k8s.io/apiserver/pkg/storage/storagebackend/factory).
const (
	etcdDialTimeout      = 20 * time.Second
	etcdKeepaliveTime    = 30 * time.Second
	etcdKeepaliveTimeout = 10 * time.Second
)

// etcdReconnect paces the cache's client's attempts to reach a member it
// lost the connection to: every second at most once the first few
// failed. gRPC's default waits 1 s, then 1.6 times longer after each
// failure, up to 2 minutes, so that a member back after an outage is
// reached up to about 0.6 times the outage later (13 s after a 30 s kill),
// and the cache's watch, which waits for the connection, stays lost that
// long. The etcd3 store's client keeps the default: it reached a member
// killed for 14.8 s only 8.8 s after its return (a fault-suite run), and
// the writes waited. An outage costs a dial a second per member.
var etcdReconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: etcdDialTimeout,
}

// etcdClientLogger is the one logger of every client newEtcdClient makes,
// at error level and without the default sampler: a sampler takes 448 KiB,
// which a logger per client added to the empty server's heap once for each
// resource (kubernetes#111476 is the same cost in the generic storage
// factory, which shares one logger). Each client holds one watch and
// makes a few keys-only reads every few minutes: at error level, too few
// messages to need sampling.
var etcdClientLogger = sync.OnceValues(func() (*zap.Logger, error) {
	cfg := logutil.DefaultZapLoggerConfig
	cfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	cfg.Sampling = nil
	return cfg.Build()
})

// newEtcdClient connects to etcd as the generic storage factory does,
// through the tracker, minus its tracing: the cache's own client, which
// follows the resource's changes and reads its keys.
func newEtcdClient(t storagebackend.TransportConfig, tracker *etcdconn.Tracker) (*clientv3.Client, error) {
	var tlsConfig *tls.Config
	tlsInfo := transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.TrustedCAFile}
	if t.CertFile != "" || t.KeyFile != "" || t.TrustedCAFile != "" {
		var err error
		if tlsConfig, err = tlsInfo.ClientConfig(); err != nil {
			return nil, err
		}
	}
	logger, err := etcdClientLogger()
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{
		Endpoints:            t.ServerList,
		TLS:                  tlsConfig,
		DialTimeout:          etcdDialTimeout,
		DialKeepAliveTime:    etcdKeepaliveTime,
		DialKeepAliveTimeout: etcdKeepaliveTimeout,
		DialOptions: []grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return tracker.Dial(ctx, "tcp", addr) }),
			grpc.WithConnectParams(etcdReconnect),
		},
		Logger: logger,
	})
}
