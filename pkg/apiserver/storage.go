package apiserver

import (
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/gate"
)

// WatchCacheOptions are the knobs of our watch cache the command line sets.
type WatchCacheOptions struct {
	// Enabled serves reads and watches from pkg/storage/cacher; false sends
	// every request, watches included, to etcd.
	Enabled bool
	// ConsistentReadFallback sends reads to etcd when the cache is not ready
	// or cannot catch up in time, instead of answering 429.
	ConsistentReadFallback bool
	// ConsistencyCheckInterval is how often each resource's cache compares
	// itself with etcd; 0 turns the check off.
	ConsistencyCheckInterval time.Duration
	// WarmStartRevisions is how far back, in etcd revisions, each cache
	// fills its history from etcd when it starts; 0 starts with an empty history.
	WarmStartRevisions int64
	// HistoryBudget bounds the bytes of objects each resource's history
	// holds; 0 is no budget.
	HistoryBudget int64
	// InitialEventsConcurrency bounds how many watches stream initial events
	// at once, across every resource; 0 is no bound. See gate.InitialEvents.
	InitialEventsConcurrency int
	// Compression is how each cache keeps its objects at rest; see
	// cacher.Compression. Empty is off.
	Compression cacher.Compression
	// Shutdown begins when the server begins to shut down; see cacher.Shutdown.
	Shutdown *cacher.Shutdown
	// Initialized is /readyz's check that every cache has listed once;
	// see cacher.Initialized.
	Initialized *cacher.Initialized
	// Sizes are --watch-cache-sizes, parsed. As upstream, a size of 0 turns
	// the cache off for that resource and any other size is ignored: the
	// event log sizes itself.
	Sizes map[schema.GroupResource]int
}

// StorageDecorator returns the decorator every fleet resource's storage is
// built with. It is the one place that chooses between our watch cache and
// raw etcd3.
//
// Upstream's Cacher (k8s.io/apiserver/pkg/storage/cacher) never serves
// requests here: New puts this decorator in place of whatever the stock
// etcd options chose (cacher.WithStorageDecorator).
func StorageDecorator(o WatchCacheOptions) generic.StorageDecorator {
	if !o.Enabled {
		return generic.UndecoratedStorage
	}
	cached := cacher.StorageDecorator(cacheConfig(o))
	return func(config *storagebackend.ConfigForResource, resourcePrefix string,
		keyFunc func(runtime.Object) (string, error), newFunc, newListFunc func() runtime.Object,
		getAttrsFunc storage.AttrFunc, triggers storage.IndexerFuncs, indexers *cache.Indexers,
	) (storage.Interface, factory.DestroyFunc, error) {
		decorate := cached
		if size, ok := o.Sizes[config.GroupResource]; ok {
			if size <= 0 {
				klog.InfoS("Not using the watch cache: --watch-cache-sizes sets 0", "resource", config.GroupResource)
				decorate = generic.UndecoratedStorage
			} else {
				klog.InfoS("Ignoring a --watch-cache-sizes size: the watch cache sizes itself", "resource", config.GroupResource, "size", size)
			}
		}
		return decorate(config, resourcePrefix, keyFunc, newFunc, newListFunc, getAttrsFunc, triggers, indexers)
	}
}

// cacheConfig is the cache's Config for what the command line set. Every
// resource's cache shares one gate of each kind: the CPU and memory they
// share out are the server's.
func cacheConfig(o WatchCacheOptions) cacher.Config {
	// 0 means off on the command line and "the default" in Config.
	checkInterval, warmStart := o.ConsistencyCheckInterval, o.WarmStartRevisions
	if checkInterval == 0 {
		checkInterval = -1
	}
	if warmStart == 0 {
		warmStart = -1
	}
	budget := o.HistoryBudget
	if budget == 0 {
		budget = -1
	}
	return cacher.Config{
		ConsistentReadFallback:   o.ConsistentReadFallback,
		ConsistencyCheckInterval: checkInterval,
		WarmStartRevisions:       warmStart,
		HistoryBudget:            budget,
		Compression:              o.Compression,
		Shutdown:                 o.Shutdown,
		Initialized:              o.Initialized,
		// The storage codec's serializers are Codecs', made from Scheme.
		Scheme:        Scheme,
		InitialEvents: gate.NewInitialEvents(gate.InitialEventsConfig{Concurrency: o.InitialEventsConcurrency}),
	}
}
