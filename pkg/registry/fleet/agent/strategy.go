// Package agent holds the registry strategy and storage for Agents.
package agent

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/validation"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry"
)

// strategy implements create, update and delete behaviour for Agents.
type strategy struct {
	registry.Strategy
}

// NewStrategy returns the strategy for the main resource.
func NewStrategy(typer runtime.ObjectTyper) strategy {
	return strategy{registry.NewStrategy(typer)}
}

func (strategy) NamespaceScoped() bool { return false }

// GetResetFields tells server-side apply that the main resource never writes status.
func (strategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return registry.ResetFields("status")
}

// PrepareForCreate clears status and starts the generation at 1.
func (strategy) PrepareForCreate(_ context.Context, obj runtime.Object) {
	a := obj.(*fleet.Agent)
	a.Status = fleet.AgentStatus{}
	a.Generation = 1
}

// PrepareForUpdate keeps status as stored and bumps the generation on a spec change, and only then.
func (strategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	a, oldA := obj.(*fleet.Agent), old.(*fleet.Agent)
	a.Status = oldA.Status
	a.Generation = registry.NextGeneration(oldA.Generation, oldA.Spec, a.Spec)
}

func (strategy) Validate(_ context.Context, obj runtime.Object) field.ErrorList {
	return validation.ValidateAgent(obj.(*fleet.Agent))
}

func (strategy) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	return validation.ValidateAgentUpdate(obj.(*fleet.Agent), old.(*fleet.Agent))
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

// PrepareForUpdate keeps spec and generation as stored.
func (statusStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	a, oldA := obj.(*fleet.Agent), old.(*fleet.Agent)
	a.Spec = oldA.Spec
	a.Generation = oldA.Generation
}

func (statusStrategy) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	return validation.ValidateAgentStatusUpdate(obj.(*fleet.Agent), old.(*fleet.Agent))
}

// GetAttrs returns the labels and selectable fields of an Agent.
func GetAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	a, ok := obj.(*fleet.Agent)
	if !ok {
		return nil, nil, fmt.Errorf("not an Agent: %T", obj)
	}
	return a.Labels, SelectableFields(a), nil
}

// SelectableFields returns the fields a selector may use.
func SelectableFields(a *fleet.Agent) fields.Set {
	return generic.AddObjectMetaFieldsSet(fields.Set{"spec.zone": a.Spec.Zone}, &a.ObjectMeta, false)
}

// Match returns the predicate for a label and field selector.
func Match(label labels.Selector, field fields.Selector) storage.SelectionPredicate {
	return storage.SelectionPredicate{Label: label, Field: field, GetAttrs: GetAttrs}
}
