// Package validation checks fleet.example.com objects. Every error carries a
// field path, so clients get a 422 that says which field is wrong.
package validation

import (
	"slices"

	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/sets"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
)

// ValidPhases are the phases an Assignment may be in.
var ValidPhases = sets.New(
	string(fleet.AssignmentPending), string(fleet.AssignmentRunning),
	string(fleet.AssignmentSucceeded), string(fleet.AssignmentFailed),
)

// ValidateAssignment validates a new Assignment.
func ValidateAssignment(a *fleet.Assignment) field.ErrorList {
	return create(&a.ObjectMeta, true,
		validateAssignmentSpec(&a.Spec, field.NewPath("spec")), validateAssignmentStatus(&a.Status, field.NewPath("status")))
}

// ValidateAssignmentUpdate validates an update of an Assignment's spec and metadata.
func ValidateAssignmentUpdate(a, old *fleet.Assignment) field.ErrorList {
	return update(&a.ObjectMeta, &old.ObjectMeta,
		validateAssignmentSpec(&a.Spec, field.NewPath("spec")),
		apimachineryvalidation.ValidateImmutableField(a.Spec.AgentName, old.Spec.AgentName, field.NewPath("spec", "agentName")),
		validateAssignmentStatus(&a.Status, field.NewPath("status")))
}

// ValidateAssignmentStatusUpdate validates an update through the status subresource.
func ValidateAssignmentStatusUpdate(a, old *fleet.Assignment) field.ErrorList {
	return update(&a.ObjectMeta, &old.ObjectMeta, validateAssignmentStatus(&a.Status, field.NewPath("status")))
}

func validateAssignmentSpec(s *fleet.AssignmentSpec, fld *field.Path) field.ErrorList {
	var allErrs field.ErrorList
	if s.AgentName == "" {
		allErrs = append(allErrs, field.Required(fld.Child("agentName"), "every assignment names the agent that runs it"))
	} else {
		for _, msg := range apimachineryvalidation.NameIsDNSSubdomain(s.AgentName, false) {
			allErrs = append(allErrs, field.Invalid(fld.Child("agentName"), s.AgentName, msg))
		}
	}
	if len(s.Payload) > fleet.MaxPayloadBytes {
		allErrs = append(allErrs, field.TooLong(fld.Child("payload"), nil, fleet.MaxPayloadBytes))
	}
	if s.Priority < fleet.MinPriority || s.Priority > fleet.MaxPriority {
		allErrs = append(allErrs, field.Invalid(fld.Child("priority"), s.Priority,
			"must be between -1000 and 1000, inclusive"))
	}
	return allErrs
}

func validateAssignmentStatus(s *fleet.AssignmentStatus, fld *field.Path) field.ErrorList {
	var allErrs field.ErrorList
	if !ValidPhases.Has(string(s.Phase)) {
		allErrs = append(allErrs, field.NotSupported(fld.Child("phase"), s.Phase, sets.List(ValidPhases)))
	}
	if s.ObservedGeneration < 0 {
		allErrs = append(allErrs, field.Invalid(fld.Child("observedGeneration"), s.ObservedGeneration, "must not be negative"))
	}
	return allErrs
}

// ValidateAgent validates a new Agent.
func ValidateAgent(a *fleet.Agent) field.ErrorList {
	return create(&a.ObjectMeta, false,
		validateAgentSpec(&a.Spec, field.NewPath("spec")), validateAgentStatus(&a.Status, field.NewPath("status")))
}

// ValidateAgentUpdate validates an update of an Agent's spec and metadata.
func ValidateAgentUpdate(a, old *fleet.Agent) field.ErrorList {
	return update(&a.ObjectMeta, &old.ObjectMeta,
		validateAgentSpec(&a.Spec, field.NewPath("spec")), validateAgentStatus(&a.Status, field.NewPath("status")))
}

// ValidateAgentStatusUpdate validates an update through the status subresource.
func ValidateAgentStatusUpdate(a, old *fleet.Agent) field.ErrorList {
	return update(&a.ObjectMeta, &old.ObjectMeta, validateAgentStatus(&a.Status, field.NewPath("status")))
}

// create is a new object's errors: its metadata's, namespaced or not, then
// the others found.
func create(meta *metav1.ObjectMeta, namespaced bool, found ...field.ErrorList) field.ErrorList {
	return append(apimachineryvalidation.ValidateObjectMeta(meta, namespaced,
		apimachineryvalidation.NameIsDNSSubdomain, field.NewPath("metadata")), slices.Concat(found...)...)
}

// update is an update's errors: its metadata's, then the others found.
func update(meta, old *metav1.ObjectMeta, found ...field.ErrorList) field.ErrorList {
	return append(apimachineryvalidation.ValidateObjectMetaUpdate(meta, old, field.NewPath("metadata")), slices.Concat(found...)...)
}

func validateAgentSpec(s *fleet.AgentSpec, fld *field.Path) field.ErrorList {
	var allErrs field.ErrorList
	// The zone is a field selector value, so it must be a valid label value.
	for _, msg := range utilvalidation.IsValidLabelValue(s.Zone) {
		allErrs = append(allErrs, field.Invalid(fld.Child("zone"), s.Zone, msg))
	}
	if s.Capacity < 0 {
		allErrs = append(allErrs, field.Invalid(fld.Child("capacity"), s.Capacity, "must not be negative"))
	}
	return allErrs
}

func validateAgentStatus(s *fleet.AgentStatus, fld *field.Path) field.ErrorList {
	return metav1validation.ValidateConditions(s.Conditions, fld.Child("conditions"))
}
