package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Agent is a worker that executes Assignments. It is cluster-scoped.
type Agent struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the agent.
	// +optional
	Spec AgentSpec `json:"spec,omitempty"`
	// Status is the observed state of the agent, written by the agent itself.
	// +optional
	Status AgentStatus `json:"status,omitempty"`
}

// AgentSpec is the desired state of an Agent.
type AgentSpec struct {
	// Zone is the failure domain the agent runs in. It must be a valid label value.
	// +optional
	Zone string `json:"zone,omitempty"`
	// Capacity is how many Assignments the agent runs at once. It must not be negative.
	// +optional
	Capacity int32 `json:"capacity,omitempty"`
}

// AgentStatus is the observed state of an Agent.
type AgentStatus struct {
	// Conditions holds the agent's conditions. The Ready condition is True
	// while the agent heartbeats.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
	// LastHeartbeatTime is when the agent last reported in.
	// +optional
	LastHeartbeatTime *metav1.Time `json:"lastHeartbeatTime,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// AgentList is a list of Agents.
type AgentList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items is the list of agents.
	Items []Agent `json:"items"`
}

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Assignment is one piece of work for one Agent.
type Assignment struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the work to do and who does it.
	// +optional
	Spec AssignmentSpec `json:"spec,omitempty"`
	// Status is how the work is going, written through the status subresource.
	// +optional
	Status AssignmentStatus `json:"status,omitempty"`
}

// AssignmentSpec is the desired state of an Assignment.
type AssignmentSpec struct {
	// AgentName names the Agent that runs this Assignment. Required and immutable.
	AgentName string `json:"agentName"`
	// Payload is an opaque description of the work, at most 256 KiB.
	// +optional
	Payload string `json:"payload,omitempty"`
	// Priority orders work on an agent, from -1000 to 1000; higher runs first.
	// +optional
	// +default=0
	Priority int32 `json:"priority,omitempty"`
}

// AssignmentPhase is where an Assignment is in its life.
// +enum
type AssignmentPhase string

// The phases of an Assignment.
const (
	AssignmentPending   AssignmentPhase = "Pending"
	AssignmentRunning   AssignmentPhase = "Running"
	AssignmentSucceeded AssignmentPhase = "Succeeded"
	AssignmentFailed    AssignmentPhase = "Failed"
)

// AssignmentStatus is the observed state of an Assignment.
type AssignmentStatus struct {
	// Phase is one of Pending, Running, Succeeded or Failed. Defaults to Pending.
	// +optional
	// +default="Pending"
	Phase AssignmentPhase `json:"phase,omitempty"`
	// Message is a human-readable detail about the phase.
	// +optional
	Message string `json:"message,omitempty"`
	// ObservedGeneration is the metadata.generation the status was written for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// AssignmentList is a list of Assignments.
type AssignmentList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items is the list of assignments.
	Items []Assignment `json:"items"`
}
