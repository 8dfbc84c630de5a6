// Package agent describes Agents to the registry.
package agent

import (
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/validation"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry"
)

// Kind is the Agent resource: cluster-scoped, selectable by spec.zone.
var Kind = &registry.Kind[fleet.Agent, *fleet.Agent]{
	Resource: "agents", Singular: "agent", ShortName: "agt",
	NewList:              func() runtime.Object { return &fleet.AgentList{} },
	Spec:                 func(a *fleet.Agent) any { return a.Spec },
	ResetStatus:          func(a *fleet.Agent) { a.Status = fleet.AgentStatus{} },
	KeepSpec:             func(a, old *fleet.Agent) { a.Spec = old.Spec },
	KeepStatus:           func(a, old *fleet.Agent) { a.Status = old.Status },
	Validate:             validation.ValidateAgent,
	ValidateUpdate:       validation.ValidateAgentUpdate,
	ValidateStatusUpdate: validation.ValidateAgentStatusUpdate,
	Fields:               func(a *fleet.Agent) fields.Set { return fields.Set{"spec.zone": a.Spec.Zone} },
	Table:                tableConvertor,
}

// NewStorage builds Agent storage over the given REST options.
func NewStorage(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (registry.Storage, error) {
	return Kind.NewStorage(scheme, fleet.GroupName, optsGetter)
}
