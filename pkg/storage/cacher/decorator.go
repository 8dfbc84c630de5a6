package cacher

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"
)

// StorageDecorator returns a generic.StorageDecorator that wraps each
// resource's etcd3 storage in a Cacher. base carries the tunables; the
// resource-specific fields are filled from what the registry passes.
//
//	store.CompleteWithOptions(&generic.StoreOptions{
//		RESTOptions: restOptionsWithDecorator(cacher.StorageDecorator(cacher.Config{})),
//		...
//	})
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
		raw, destroyRaw, err := generic.NewRawStorage(config, newFunc, newListFunc, resourcePrefix)
		if err != nil {
			return nil, nil, err
		}
		cfg := base
		cfg.Storage = raw
		cfg.GroupResource = config.GroupResource
		cfg.ResourcePrefix = resourcePrefix
		cfg.KeyFunc = keyFunc
		cfg.NewFunc = newFunc
		cfg.NewListFunc = newListFunc
		cfg.GetAttrsFunc = getAttrsFunc
		cfg.IndexerFuncs = triggerFuncs
		cfg.Indexers = indexers
		c, err := New(cfg)
		if err != nil {
			destroyRaw()
			return nil, nil, err
		}
		return c, func() { c.Stop(); destroyRaw() }, nil
	}
}
