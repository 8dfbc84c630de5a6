package cacher

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
)

// WithStorageDecorator returns getter with decorator in place of whatever
// storage decorator getter's RESTOptions carry: the etcd options' choice
// of upstream's Cacher or none. Wrapping a generic apiserver's
// RESTOptionsGetter with it, before the REST storages are built, is all it
// takes to serve their lists and watches from this cache:
//
//	cfg.GenericConfig.RESTOptionsGetter = cacher.WithStorageDecorator(
//		cfg.GenericConfig.RESTOptionsGetter, cacher.StorageDecorator(cacher.Config{}))
func WithStorageDecorator(getter generic.RESTOptionsGetter, decorator generic.StorageDecorator) generic.RESTOptionsGetter {
	return withDecorator{delegate: getter, decorator: decorator}
}

// withDecorator overrides the decorator of every RESTOptions it hands out.
type withDecorator struct {
	delegate  generic.RESTOptionsGetter
	decorator generic.StorageDecorator
}

// GetRESTOptions implements generic.RESTOptionsGetter.
func (g withDecorator) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := g.delegate.GetRESTOptions(resource, example)
	if err != nil {
		return opts, err
	}
	opts.Decorator = g.decorator
	return opts, nil
}
