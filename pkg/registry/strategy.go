package registry

import (
	"context"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// Strategy holds the strategy methods every fleet resource answers alike.
// Resource strategies embed it and add scope, preparation and validation.
type Strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
}

// NewStrategy returns the shared part of a resource strategy.
func NewStrategy(typer runtime.ObjectTyper) Strategy {
	return Strategy{ObjectTyper: typer, NameGenerator: names.SimpleNameGenerator}
}

// WarningsOnCreate implements rest.RESTCreateStrategy.
func (Strategy) WarningsOnCreate(context.Context, runtime.Object) []string { return nil }

// AllowCreateOnUpdate implements rest.RESTUpdateStrategy: PUT never creates.
func (Strategy) AllowCreateOnUpdate(context.Context) bool { return false }

// AllowUnconditionalUpdate implements rest.RESTUpdateStrategy.
func (Strategy) AllowUnconditionalUpdate(context.Context) bool { return true }

// Canonicalize implements rest.RESTCreateStrategy.
func (Strategy) Canonicalize(runtime.Object) {}

// WarningsOnUpdate implements rest.RESTUpdateStrategy.
func (Strategy) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}

// ResetFields tells server-side apply that a strategy never writes the
// given top-level field ("status" for the main resource, "spec" for the
// status subresource), in every served version.
func ResetFields(field string) map[fieldpath.APIVersion]*fieldpath.Set {
	set := fieldpath.NewSet(fieldpath.MakePathOrDie(field))
	return map[fieldpath.APIVersion]*fieldpath.Set{"fleet.example.com/v1alpha1": set, "fleet.example.com/v1beta1": set}
}

// NextGeneration is metadata.generation after an update: one more when the
// spec changed, unchanged otherwise, so that status.observedGeneration means
// something.
func NextGeneration(old int64, oldSpec, newSpec any) int64 {
	if apiequality.Semantic.DeepEqual(oldSpec, newSpec) {
		return old
	}
	return old + 1
}
