// Package assignment holds the registry strategy and storage for Assignments.
package assignment

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/validation"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry"
)

// AgentNameField is the field agents select their own Assignments by. It is
// the watch cache's trigger field: watchers that pin it are found by index.
const AgentNameField = "spec.agentName"

// strategy implements create, update and delete behaviour for Assignments.
type strategy struct {
	registry.Strategy
}

// NewStrategy returns the strategy for the main resource.
func NewStrategy(typer runtime.ObjectTyper) strategy {
	return strategy{registry.NewStrategy(typer)}
}

func (strategy) NamespaceScoped() bool { return true }

// GetResetFields tells server-side apply that the main resource never writes status.
func (strategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return registry.ResetFields("status")
}

// PrepareForCreate clears status, sets the default phase and starts the generation at 1.
func (strategy) PrepareForCreate(_ context.Context, obj runtime.Object) {
	a := obj.(*fleet.Assignment)
	a.Status = fleet.AssignmentStatus{Phase: fleet.AssignmentPending}
	a.Generation = 1
}

// PrepareForUpdate keeps status as stored and bumps the generation on a spec change, and only then.
func (strategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	a, oldA := obj.(*fleet.Assignment), old.(*fleet.Assignment)
	a.Status = oldA.Status
	a.Generation = registry.NextGeneration(oldA.Generation, oldA.Spec, a.Spec)
}

func (strategy) Validate(_ context.Context, obj runtime.Object) field.ErrorList {
	return validation.ValidateAssignment(obj.(*fleet.Assignment))
}

func (strategy) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	return validation.ValidateAssignmentUpdate(obj.(*fleet.Assignment), old.(*fleet.Assignment))
}

// statusStrategy implements updates through the status subresource.
type statusStrategy struct {
	strategy
}

// NewStatusStrategy returns the strategy for the status subresource.
func NewStatusStrategy(s strategy) statusStrategy { return statusStrategy{s} }

// GetResetFields tells server-side apply that the status subresource never writes spec.
func (statusStrategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return registry.ResetFields("spec")
}

// PrepareForUpdate keeps spec and metadata generation as stored: status writers change status only.
func (statusStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	a, oldA := obj.(*fleet.Assignment), old.(*fleet.Assignment)
	a.Spec = oldA.Spec
	a.Generation = oldA.Generation
}

func (statusStrategy) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	return validation.ValidateAssignmentStatusUpdate(obj.(*fleet.Assignment), old.(*fleet.Assignment))
}

// GetAttrs returns the labels and selectable fields of an Assignment.
func GetAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	a, ok := obj.(*fleet.Assignment)
	if !ok {
		return nil, nil, fmt.Errorf("not an Assignment: %T", obj)
	}
	return a.Labels, SelectableFields(a), nil
}

// SelectableFields returns the fields a selector may use, in internal names.
func SelectableFields(a *fleet.Assignment) fields.Set {
	return generic.AddObjectMetaFieldsSet(fields.Set{
		AgentNameField: a.Spec.AgentName,
		"status.phase": string(a.Status.Phase),
	}, &a.ObjectMeta, true)
}

// Match returns the predicate for a label and field selector.
func Match(label labels.Selector, field fields.Selector) storage.SelectionPredicate {
	return storage.SelectionPredicate{
		Label:       label,
		Field:       field,
		GetAttrs:    GetAttrs,
		IndexFields: []string{AgentNameField},
	}
}

// AgentNameTriggerFunc returns the trigger value a watch cache indexes watchers by.
func AgentNameTriggerFunc(obj runtime.Object) string {
	return obj.(*fleet.Assignment).Spec.AgentName
}

// Indexers index cached Assignments by agent name, for list with a field selector.
func Indexers() *cache.Indexers {
	return &cache.Indexers{
		storage.FieldIndex(AgentNameField): func(obj interface{}) ([]string, error) {
			a, ok := obj.(*fleet.Assignment)
			if !ok {
				return nil, fmt.Errorf("not an Assignment: %T", obj)
			}
			return []string{a.Spec.AgentName}, nil
		},
	}
}
