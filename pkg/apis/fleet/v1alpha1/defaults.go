package v1alpha1

import "k8s.io/apimachinery/pkg/runtime"

func addDefaultingFuncs(scheme *runtime.Scheme) error {
	return RegisterDefaults(scheme)
}

// SetDefaults_AssignmentStatus defaults the phase to Pending.
func SetDefaults_AssignmentStatus(obj *AssignmentStatus) {
	if obj.Phase == "" {
		obj.Phase = AssignmentPending
	}
}
