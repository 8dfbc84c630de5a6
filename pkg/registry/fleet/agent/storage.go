package agent

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry"
)

// Storage is the Agent resource and its status subresource.
type Storage struct {
	Agent  *registry.REST
	Status *registry.StatusREST
}

// NewStorage builds Agent storage over the given REST options.
func NewStorage(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (Storage, error) {
	s := NewStrategy(scheme)
	store := &genericregistry.Store{
		NewFunc:                   func() runtime.Object { return &fleet.Agent{} },
		NewListFunc:               func() runtime.Object { return &fleet.AgentList{} },
		PredicateFunc:             Match,
		DefaultQualifiedResource:  fleet.Resource("agents"),
		SingularQualifiedResource: fleet.Resource("agent"),

		CreateStrategy:      s,
		UpdateStrategy:      s,
		DeleteStrategy:      s,
		ResetFieldsStrategy: s,

		TableConvertor: tableConvertor,
	}
	options := &generic.StoreOptions{
		RESTOptions: optsGetter,
		AttrFunc:    GetAttrs,
	}
	if err := store.CompleteWithOptions(options); err != nil {
		return Storage{}, err
	}
	statusStore := *store
	statusStore.UpdateStrategy = NewStatusStrategy(s)
	statusStore.ResetFieldsStrategy = NewStatusStrategy(s)
	return Storage{
		Agent:  registry.NewREST[fleet.Agent](store, "agt"),
		Status: registry.NewStatusREST(&statusStore),
	}, nil
}
