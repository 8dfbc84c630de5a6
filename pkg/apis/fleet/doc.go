// +k8s:deepcopy-gen=package
// +groupName=fleet.example.com

// Package fleet holds the internal (hub) types of the fleet.example.com API
// group. Every served version converts to and from these types; storage uses
// v1beta1.
package fleet
