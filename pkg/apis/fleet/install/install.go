// Package install registers the fleet.example.com API group in a scheme.
package install

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1alpha1"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// Install registers the internal types and both served versions, with
// v1beta1 preferred.
func Install(scheme *runtime.Scheme) {
	utilruntime.Must(fleet.AddToScheme(scheme))
	utilruntime.Must(v1beta1.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	utilruntime.Must(scheme.SetVersionPriority(v1beta1.SchemeGroupVersion, v1alpha1.SchemeGroupVersion))
}
