package fleet

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Agent is a worker that executes Assignments. It is cluster-scoped.
type Agent struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   AgentSpec
	Status AgentStatus
}

// AgentSpec is the desired state of an Agent.
type AgentSpec struct {
	// Zone is the failure domain the agent runs in.
	Zone string
	// Capacity is how many Assignments the agent runs at once.
	Capacity int32
}

// AgentConditionReady is the condition type set while the agent heartbeats.
const AgentConditionReady = "Ready"

// AgentStatus is the observed state of an Agent.
type AgentStatus struct {
	// Conditions holds the agent's conditions, keyed by type.
	Conditions []metav1.Condition
	// LastHeartbeatTime is when the agent last reported in.
	LastHeartbeatTime *metav1.Time
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// AgentList is a list of Agents.
type AgentList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []Agent
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Assignment is one piece of work for one Agent. It is namespaced.
type Assignment struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   AssignmentSpec
	Status AssignmentStatus
}

// MaxPayloadBytes bounds spec.payload, so that one object stays far below
// etcd's request size limit.
const MaxPayloadBytes = 256 * 1024

// MinPriority and MaxPriority bound spec.priority.
const (
	MinPriority = -1000
	MaxPriority = 1000
)

// AssignmentSpec is the desired state of an Assignment.
type AssignmentSpec struct {
	// AgentName names the Agent that runs this Assignment. Immutable.
	AgentName string
	// Payload is opaque work description, at most MaxPayloadBytes.
	Payload string
	// Priority orders work on an agent; higher runs first.
	Priority int32
}

// AssignmentPhase is where an Assignment is in its life.
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
	Phase              AssignmentPhase
	Message            string
	ObservedGeneration int64
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// AssignmentList is a list of Assignments.
type AssignmentList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []Assignment
}
