package assignment

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry"
)

// Storage is the Assignment resource and its status subresource.
type Storage struct {
	Assignment *registry.REST
	Status     *registry.StatusREST
}

// NewStorage builds Assignment storage over the given REST options.
func NewStorage(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (Storage, error) {
	s := NewStrategy(scheme)
	store := &genericregistry.Store{
		NewFunc:                   func() runtime.Object { return &fleet.Assignment{} },
		NewListFunc:               func() runtime.Object { return &fleet.AssignmentList{} },
		PredicateFunc:             Match,
		DefaultQualifiedResource:  fleet.Resource("assignments"),
		SingularQualifiedResource: fleet.Resource("assignment"),

		CreateStrategy:      s,
		UpdateStrategy:      s,
		DeleteStrategy:      s,
		ResetFieldsStrategy: s,

		TableConvertor: tableConvertor,
	}
	options := &generic.StoreOptions{
		RESTOptions: optsGetter,
		AttrFunc:    GetAttrs,
		TriggerFunc: map[string]storage.IndexerFunc{AgentNameField: AgentNameTriggerFunc},
		Indexers:    Indexers(),
	}
	if err := store.CompleteWithOptions(options); err != nil {
		return Storage{}, err
	}
	statusStore := *store
	statusStore.UpdateStrategy = NewStatusStrategy(s)
	statusStore.ResetFieldsStrategy = NewStatusStrategy(s)
	return Storage{
		Assignment: registry.NewREST[fleet.Assignment](store, "asg"),
		Status:     registry.NewStatusREST(&statusStore),
	}, nil
}
