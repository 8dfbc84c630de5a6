// +k8s:openapi-gen=true
// +k8s:deepcopy-gen=package
// +k8s:conversion-gen=github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet
// +k8s:defaulter-gen=TypeMeta
// +groupName=fleet.example.com
// +k8s:openapi-model-package=com.example.fleet.v1alpha1

// Package v1alpha1 is the v1alpha1 version of fleet.example.com: served for
// older clients. It spells the agent field spec.agent.
package v1alpha1
