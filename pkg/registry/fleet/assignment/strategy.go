// Package assignment describes Assignments to the registry.
package assignment

import (
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/validation"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry"
)

// AgentNameField is the field agents select their own Assignments by. It is
// the watch cache's trigger field: watchers that pin it are found by index.
const AgentNameField = "spec.agentName"

// Kind is the Assignment resource: namespaced, created Pending, selectable
// by agent and phase, and indexed by agent.
var Kind = &registry.Kind[fleet.Assignment, *fleet.Assignment]{
	Resource: "assignments", Singular: "assignment", ShortName: "asg", Namespaced: true,
	NewList: func() runtime.Object { return &fleet.AssignmentList{} },
	Spec:    func(a *fleet.Assignment) any { return a.Spec },
	ResetStatus: func(a *fleet.Assignment) {
		a.Status = fleet.AssignmentStatus{Phase: fleet.AssignmentPending}
	},
	KeepSpec:             func(a, old *fleet.Assignment) { a.Spec = old.Spec },
	KeepStatus:           func(a, old *fleet.Assignment) { a.Status = old.Status },
	Validate:             validation.ValidateAssignment,
	ValidateUpdate:       validation.ValidateAssignmentUpdate,
	ValidateStatusUpdate: validation.ValidateAssignmentStatusUpdate,
	Fields: func(a *fleet.Assignment) fields.Set {
		return fields.Set{AgentNameField: a.Spec.AgentName, "status.phase": string(a.Status.Phase)}
	},
	TriggerField: AgentNameField,
	Trigger:      func(a *fleet.Assignment) string { return a.Spec.AgentName },
	Table:        tableConvertor,
}

// NewStorage builds Assignment storage over the given REST options.
func NewStorage(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (registry.Storage, error) {
	return Kind.NewStorage(scheme, fleet.GroupName, optsGetter)
}
