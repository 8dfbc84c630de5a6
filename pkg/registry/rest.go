// Package registry holds what the fleet resources' storage shares.
package registry

import (
	"context"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
)

// REST is the generic registry store with one difference: a resourceVersion
// that is not a number is rejected here with 400 Bad Request.
//
// Upstream lets it reach storage, where etcd3 and the watch cache turn it
// into a 500. We check it in the REST layer on purpose, so that the answer is
// the same with the watch cache on or off.
type REST struct {
	*genericregistry.Store
	shortNames []string
}

var (
	_ rest.ShortNamesProvider = &REST{}
	_ rest.CategoriesProvider = &REST{}
)

// NewREST wraps a completed store that answers to the given short names.
func NewREST(store *genericregistry.Store, shortNames ...string) *REST {
	return &REST{Store: store, shortNames: shortNames}
}

// ShortNames implements rest.ShortNamesProvider.
func (r *REST) ShortNames() []string { return r.shortNames }

// Categories implements rest.CategoriesProvider: `kubectl get fleet` lists every fleet resource.
func (r *REST) Categories() []string { return []string{"fleet"} }

// Get implements rest.Getter.
func (r *REST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	if err := ValidateResourceVersion(options.ResourceVersion); err != nil {
		return nil, err
	}
	return r.Store.Get(ctx, name, options)
}

// List implements rest.Lister.
func (r *REST) List(ctx context.Context, options *metainternalversion.ListOptions) (runtime.Object, error) {
	if options != nil {
		if err := ValidateResourceVersion(options.ResourceVersion); err != nil {
			return nil, err
		}
	}
	return r.Store.List(ctx, options)
}

// Watch implements rest.Watcher.
func (r *REST) Watch(ctx context.Context, options *metainternalversion.ListOptions) (watch.Interface, error) {
	if options != nil {
		if err := ValidateResourceVersion(options.ResourceVersion); err != nil {
			return nil, err
		}
	}
	return r.Store.Watch(ctx, options)
}

// ValidateResourceVersion accepts "" and non-negative integers.
func ValidateResourceVersion(rv string) error {
	if rv == "" {
		return nil
	}
	if _, err := strconv.ParseUint(rv, 10, 64); err != nil {
		return apierrors.NewBadRequest(fmt.Sprintf(
			"invalid resourceVersion %q: it must be a resourceVersion returned by this server (a non-negative integer), "+
				"or empty for the latest state", rv))
	}
	return nil
}
