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
	"k8s.io/apiserver/pkg/features"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/sharding"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
)

// REST is the generic registry store with two differences.
//
// A resourceVersion that is not a number, or a shard selector that does not
// parse, is rejected here with 400 Bad Request. Upstream lets the first
// reach storage, where etcd3 and the watch cache turn it into a 500, and
// answers the second with a 500 from the generic registry. We check both
// in the REST layer on purpose, so that the answer is the same with the
// watch cache on or off; the message is upstream's.
//
// A list from the watch cache is answered with the cached objects
// themselves, not copies of them (see sharedList).
type REST struct {
	*genericregistry.Store
	// lister is Store with a NewListFunc that returns a storageList.
	lister     *genericregistry.Store
	shortNames []string
}

// listResponder is a storageList, of any item type.
type listResponder interface {
	response(newList func() runtime.Object, gz *GzipResponse) (runtime.Object, error)
}

var (
	_ rest.ShortNamesProvider = &REST{}
	_ rest.CategoriesProvider = &REST{}
)

// NewREST wraps a completed store of objects of type T, whose list type has
// Items []T, that answers to the given short names.
func NewREST[T any, PT interface {
	*T
	runtime.Object
}](store *genericregistry.Store, shortNames ...string) *REST {
	lister := *store
	lister.NewListFunc = func() runtime.Object { return &storageList[T, PT]{} }
	return &REST{Store: store, lister: &lister, shortNames: shortNames}
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
	if err := validateListOptions(options); err != nil {
		return nil, err
	}
	out, err := r.lister.List(ctx, options)
	if err != nil {
		return nil, err
	}
	l, ok := out.(listResponder)
	if !ok {
		return nil, fmt.Errorf("storage answered a list with %T", out)
	}
	return l.response(r.Store.NewListFunc, GzipResponseFrom(ctx))
}

// Watch implements rest.Watcher.
func (r *REST) Watch(ctx context.Context, options *metainternalversion.ListOptions) (watch.Interface, error) {
	if err := validateListOptions(options); err != nil {
		return nil, err
	}
	return r.Store.Watch(ctx, options)
}

// validateListOptions checks what a list or watch names that upstream
// would answer with a 500: the resourceVersion, a negative timeoutSeconds,
// and the shard selector
// while the ShardedListAndWatch feature gate is on (off, the API ignores
// it, as upstream does).
func validateListOptions(options *metainternalversion.ListOptions) error {
	if options == nil {
		return nil
	}
	if err := ValidateResourceVersion(options.ResourceVersion); err != nil {
		return err
	}
	if options.TimeoutSeconds != nil && *options.TimeoutSeconds < 0 {
		// Upstream starts the watch with a deadline already past, which a
		// consistent watch-list answers with 500. A client asked for
		// something that cannot mean anything; say so.
		return apierrors.NewBadRequest(fmt.Sprintf("timeoutSeconds must be 0 (the server's default) or positive, not %d",
			*options.TimeoutSeconds))
	}
	if options.ShardSelector != "" && utilfeature.DefaultFeatureGate.Enabled(features.ShardedListAndWatch) {
		if _, err := sharding.Parse(options.ShardSelector); err != nil {
			return apierrors.NewBadRequest(fmt.Sprintf("invalid shard selector: %v. A shard selector is "+
				"shardRange(object.metadata.uid, '0x<16 hex digits>', '0x<16 hex digits>'), or the same on "+
				"object.metadata.namespace, with several joined by ||; the end may be '0x10000000000000000'", err))
		}
	}
	return nil
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
