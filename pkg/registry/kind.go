package registry

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// Object is a pointer to a fleet resource's internal type.
type Object[T any] interface {
	*T
	runtime.Object
	metav1.Object
}

// Kind is what one fleet resource does differently from the others. Its
// strategies, the main resource's and the status subresource's, and its
// store are the same for every resource, as Kubernetes' resources with a
// status subresource behave:
//   - a create clears status and starts metadata.generation at 1;
//   - an update keeps status as stored, and bumps the generation when the
//     spec changed, and only then;
//   - a status update keeps spec and generation as stored.
type Kind[T any, P Object[T]] struct {
	// Resource and Singular name the resource; ShortName is kubectl's.
	Resource, Singular, ShortName string
	Namespaced                    bool
	NewList                       func() runtime.Object
	// Spec returns the object's spec, which sets the generation.
	Spec func(P) any
	// ResetStatus sets a created object's status to its initial value.
	ResetStatus func(P)
	// KeepSpec and KeepStatus copy old's spec or status into obj.
	KeepSpec, KeepStatus func(obj, old P)
	// Validate, ValidateUpdate and ValidateStatusUpdate check a create, an
	// update and a status update.
	Validate                             func(P) field.ErrorList
	ValidateUpdate, ValidateStatusUpdate func(obj, old P) field.ErrorList
	// Fields returns the selectable fields other than metadata's.
	Fields func(P) fields.Set
	// TriggerField, if set, is a field of Fields that Trigger returns
	// without building the set: the watch cache indexes watchers by it, and
	// lists with a selector on it are served from an index.
	TriggerField string
	Trigger      func(P) string
	// Table prints the resource for kubectl.
	Table rest.TableConvertor
}

// Strategy returns the main resource's strategy.
func (k *Kind[T, P]) Strategy(typer runtime.ObjectTyper) *KindStrategy[T, P] {
	return &KindStrategy[T, P]{Strategy: NewStrategy(typer), kind: k}
}

// KindStrategy implements create, update and delete for a Kind.
type KindStrategy[T any, P Object[T]] struct {
	Strategy
	kind *Kind[T, P]
}

// NamespaceScoped implements rest.RESTCreateStrategy.
func (s *KindStrategy[T, P]) NamespaceScoped() bool { return s.kind.Namespaced }

// GetResetFields tells server-side apply that the main resource never writes status.
func (*KindStrategy[T, P]) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return ResetFields("status")
}

// PrepareForCreate resets status and starts the generation at 1.
func (s *KindStrategy[T, P]) PrepareForCreate(_ context.Context, obj runtime.Object) {
	o := obj.(P)
	s.kind.ResetStatus(o)
	o.SetGeneration(1)
}

// PrepareForUpdate keeps status as stored and bumps the generation on a spec change, and only then.
func (s *KindStrategy[T, P]) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	o, oldO := obj.(P), old.(P)
	s.kind.KeepStatus(o, oldO)
	o.SetGeneration(NextGeneration(oldO.GetGeneration(), s.kind.Spec(oldO), s.kind.Spec(o)))
}

// Validate implements rest.RESTCreateStrategy.
func (s *KindStrategy[T, P]) Validate(_ context.Context, obj runtime.Object) field.ErrorList {
	return s.kind.Validate(obj.(P))
}

// ValidateUpdate implements rest.RESTUpdateStrategy.
func (s *KindStrategy[T, P]) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	return s.kind.ValidateUpdate(obj.(P), old.(P))
}

// Status returns the status subresource's strategy.
func (s *KindStrategy[T, P]) Status() *KindStatusStrategy[T, P] { return &KindStatusStrategy[T, P]{s} }

// KindStatusStrategy implements updates through the status subresource.
type KindStatusStrategy[T any, P Object[T]] struct {
	*KindStrategy[T, P]
}

// GetResetFields tells server-side apply that the status subresource never writes spec.
func (*KindStatusStrategy[T, P]) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return ResetFields("spec")
}

// PrepareForUpdate keeps spec and generation as stored: status writers change status only.
func (s *KindStatusStrategy[T, P]) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	o, oldO := obj.(P), old.(P)
	s.kind.KeepSpec(o, oldO)
	o.SetGeneration(oldO.GetGeneration())
}

// ValidateUpdate implements rest.RESTUpdateStrategy.
func (s *KindStatusStrategy[T, P]) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	return s.kind.ValidateStatusUpdate(obj.(P), old.(P))
}

// SelectableFields returns the fields a selector may use: Fields, and
// metadata.name and, for a namespaced resource, metadata.namespace, as
// generic.AddObjectMetaFieldsSet adds them.
func (k *Kind[T, P]) SelectableFields(o P) fields.Set {
	set := k.Fields(o)
	set["metadata.name"] = o.GetName()
	if k.Namespaced {
		set["metadata.namespace"] = o.GetNamespace()
	}
	return set
}

// as returns obj as the kind's type, or an error naming both types.
func (k *Kind[T, P]) as(obj any) (P, error) {
	o, ok := obj.(P)
	if !ok {
		return nil, fmt.Errorf("not a %T: %T", P(nil), obj)
	}
	return o, nil
}

// GetAttrs returns an object's labels and selectable fields.
func (k *Kind[T, P]) GetAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	o, err := k.as(obj)
	if err != nil {
		return nil, nil, err
	}
	return o.GetLabels(), k.SelectableFields(o), nil
}

// Match returns the predicate for a label and field selector.
func (k *Kind[T, P]) Match(label labels.Selector, field fields.Selector) storage.SelectionPredicate {
	p := storage.SelectionPredicate{Label: label, Field: field, GetAttrs: k.GetAttrs}
	if k.TriggerField != "" {
		p.IndexFields = []string{k.TriggerField}
	}
	return p
}

// Storage is a resource and its status subresource.
type Storage struct {
	Main   *REST
	Status *StatusREST
}

// NewStorage builds the resource's storage over the given REST options.
func (k *Kind[T, P]) NewStorage(scheme *runtime.Scheme, group string, optsGetter generic.RESTOptionsGetter) (Storage, error) {
	s := k.Strategy(scheme)
	store := &genericregistry.Store{
		NewFunc:                   func() runtime.Object { return P(new(T)) },
		NewListFunc:               k.NewList,
		PredicateFunc:             k.Match,
		DefaultQualifiedResource:  schema.GroupResource{Group: group, Resource: k.Resource},
		SingularQualifiedResource: schema.GroupResource{Group: group, Resource: k.Singular},

		CreateStrategy:      s,
		UpdateStrategy:      s,
		DeleteStrategy:      s,
		ResetFieldsStrategy: s,

		TableConvertor: k.Table,
	}
	options := &generic.StoreOptions{RESTOptions: optsGetter, AttrFunc: k.GetAttrs}
	if k.TriggerField != "" {
		trigger := func(obj runtime.Object) string { return k.Trigger(obj.(P)) }
		options.TriggerFunc = map[string]storage.IndexerFunc{k.TriggerField: trigger}
		options.Indexers = &cache.Indexers{
			storage.FieldIndex(k.TriggerField): func(obj any) ([]string, error) {
				o, err := k.as(obj)
				if err != nil {
					return nil, err
				}
				return []string{k.Trigger(o)}, nil
			},
		}
	}
	if err := store.CompleteWithOptions(options); err != nil {
		return Storage{}, err
	}
	statusStore := *store
	statusStore.UpdateStrategy = s.Status()
	statusStore.ResetFieldsStrategy = s.Status()
	return Storage{Main: NewREST[T, P](store, k.ShortName), Status: NewStatusREST(&statusStore)}, nil
}
