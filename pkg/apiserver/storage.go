package apiserver

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
)

// StorageDecorator returns the decorator every fleet resource's storage is
// built with. It is the one place that chooses between the watch cache and
// raw etcd3: with watchCache false each request, watches included, goes to
// etcd; with it true the resource is served by pkg/storage/cacher.
//
// Upstream's Cacher (k8s.io/apiserver/pkg/storage/cacher) never serves
// requests here: withDecorator replaces whatever decorator the stock etcd
// options chose.
func StorageDecorator(watchCache bool) generic.StorageDecorator {
	// Until pkg/storage/cacher lands, both modes are raw etcd3.
	return generic.UndecoratedStorage
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
