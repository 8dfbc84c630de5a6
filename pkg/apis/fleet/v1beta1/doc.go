// +k8s:openapi-gen=true
// +k8s:deepcopy-gen=package
// +k8s:conversion-gen=github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet
// +k8s:defaulter-gen=TypeMeta
// +groupName=fleet.example.com
// +k8s:openapi-model-package=com.example.fleet.v1beta1

// Package v1beta1 is the v1beta1 version of fleet.example.com: the storage
// and preferred version.
package v1beta1
