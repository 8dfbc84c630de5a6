package v1alpha1

import (
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// assignmentFieldLabels maps v1alpha1 field selectors to internal ones.
// v1alpha1 spells spec.agentName as spec.agent.
var assignmentFieldLabels = map[string]string{
	"metadata.name":      "metadata.name",
	"metadata.namespace": "metadata.namespace",
	"spec.agent":         "spec.agentName",
	"status.phase":       "status.phase",
}

var assignmentFieldLabelNames = []string{"metadata.name", "metadata.namespace", "spec.agent", "status.phase"}

var agentFieldLabels = []string{"metadata.name", "spec.zone"}

func addFieldLabelConversionFuncs(scheme *runtime.Scheme) error {
	if err := scheme.AddFieldLabelConversionFunc(SchemeGroupVersion.WithKind("Assignment"),
		func(label, value string) (string, string, error) {
			internal, ok := assignmentFieldLabels[label]
			if !ok {
				return "", "", v1beta1.UnsupportedFieldLabel("Assignment", label, assignmentFieldLabelNames)
			}
			return internal, value, nil
		}); err != nil {
		return err
	}
	return scheme.AddFieldLabelConversionFunc(SchemeGroupVersion.WithKind("Agent"),
		v1beta1.IdentityFieldLabels("Agent", agentFieldLabels))
}

// Convert_v1alpha1_AssignmentSpec_To_fleet_AssignmentSpec renames spec.agent to spec.agentName.
func Convert_v1alpha1_AssignmentSpec_To_fleet_AssignmentSpec(in *AssignmentSpec, out *fleet.AssignmentSpec, s conversion.Scope) error {
	if err := autoConvert_v1alpha1_AssignmentSpec_To_fleet_AssignmentSpec(in, out, s); err != nil {
		return err
	}
	out.AgentName = in.Agent
	return nil
}

// Convert_fleet_AssignmentSpec_To_v1alpha1_AssignmentSpec renames spec.agentName to spec.agent.
func Convert_fleet_AssignmentSpec_To_v1alpha1_AssignmentSpec(in *fleet.AssignmentSpec, out *AssignmentSpec, s conversion.Scope) error {
	if err := autoConvert_fleet_AssignmentSpec_To_v1alpha1_AssignmentSpec(in, out, s); err != nil {
		return err
	}
	out.Agent = in.AgentName
	return nil
}
