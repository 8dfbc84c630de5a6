package v1beta1

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
)

// assignmentFieldLabels are the field selectors Assignments support in v1beta1.
var assignmentFieldLabels = []string{"metadata.name", "metadata.namespace", "spec.agentName", "status.phase"}

// agentFieldLabels are the field selectors Agents support.
var agentFieldLabels = []string{"metadata.name", "spec.zone"}

func addFieldLabelConversionFuncs(scheme *runtime.Scheme) error {
	if err := scheme.AddFieldLabelConversionFunc(SchemeGroupVersion.WithKind("Assignment"),
		IdentityFieldLabels("Assignment", assignmentFieldLabels)); err != nil {
		return err
	}
	return scheme.AddFieldLabelConversionFunc(SchemeGroupVersion.WithKind("Agent"),
		IdentityFieldLabels("Agent", agentFieldLabels))
}

// IdentityFieldLabels accepts the given field labels unchanged and rejects any
// other with an error that lists the supported ones. The REST handler turns
// that error into a 400 Bad Request.
func IdentityFieldLabels(kind string, supported []string) runtime.FieldLabelConversionFunc {
	return func(label, value string) (string, string, error) {
		for _, s := range supported {
			if s == label {
				return label, value, nil
			}
		}
		return "", "", UnsupportedFieldLabel(kind, label, supported)
	}
}

// UnsupportedFieldLabel is the error for a field selector on a field that is
// not selectable.
func UnsupportedFieldLabel(kind, label string, supported []string) error {
	return fmt.Errorf("field label %q is not supported for %s; supported field selectors are: %s",
		label, kind, strings.Join(supported, ", "))
}
