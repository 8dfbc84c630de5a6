package validation

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
)

func validAssignment() *fleet.Assignment {
	return &fleet.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", ResourceVersion: "1"},
		Spec:       fleet.AssignmentSpec{AgentName: "agent-1"},
		Status:     fleet.AssignmentStatus{Phase: fleet.AssignmentPending},
	}
}

func TestValidateAssignment(t *testing.T) {
	tests := []struct {
		name      string
		mutate    func(*fleet.Assignment)
		wantField string // empty: valid
	}{
		{name: "valid", mutate: func(*fleet.Assignment) {}},
		{name: "payload at the limit", mutate: func(a *fleet.Assignment) { a.Spec.Payload = strings.Repeat("x", fleet.MaxPayloadBytes) }},
		{name: "payload over the limit", mutate: func(a *fleet.Assignment) { a.Spec.Payload = strings.Repeat("x", fleet.MaxPayloadBytes+1) }, wantField: "spec.payload"},
		{name: "agent missing", mutate: func(a *fleet.Assignment) { a.Spec.AgentName = "" }, wantField: "spec.agentName"},
		{name: "agent not a name", mutate: func(a *fleet.Assignment) { a.Spec.AgentName = "Not_A_Name" }, wantField: "spec.agentName"},
		{name: "priority at the bounds", mutate: func(a *fleet.Assignment) { a.Spec.Priority = -1000 }},
		{name: "priority too high", mutate: func(a *fleet.Assignment) { a.Spec.Priority = 1001 }, wantField: "spec.priority"},
		{name: "priority too low", mutate: func(a *fleet.Assignment) { a.Spec.Priority = -1001 }, wantField: "spec.priority"},
		{name: "unknown phase", mutate: func(a *fleet.Assignment) { a.Status.Phase = "Lost" }, wantField: "status.phase"},
		{name: "negative observed generation", mutate: func(a *fleet.Assignment) { a.Status.ObservedGeneration = -1 }, wantField: "status.observedGeneration"},
		{name: "missing namespace", mutate: func(a *fleet.Assignment) { a.Namespace = "" }, wantField: "metadata.namespace"},
		{name: "bad name", mutate: func(a *fleet.Assignment) { a.Name = "UPPER" }, wantField: "metadata.name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := validAssignment()
			tc.mutate(a)
			checkErrors(t, ValidateAssignment(a).ToAggregate(), tc.wantField)
		})
	}
}

func TestValidateAssignmentUpdate(t *testing.T) {
	old := validAssignment()
	changed := validAssignment()
	changed.Spec.AgentName = "agent-2"
	checkErrors(t, ValidateAssignmentUpdate(changed, old).ToAggregate(), "spec.agentName")

	same := validAssignment()
	same.Spec.Priority = 7
	checkErrors(t, ValidateAssignmentUpdate(same, old).ToAggregate(), "")
}

func TestValidateAgent(t *testing.T) {
	tests := []struct {
		name      string
		agent     fleet.Agent
		wantField string
	}{
		{name: "valid", agent: fleet.Agent{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: fleet.AgentSpec{Zone: "eu-1", Capacity: 4}}},
		{name: "namespaced", agent: fleet.Agent{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}}, wantField: "metadata.namespace"},
		{name: "negative capacity", agent: fleet.Agent{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: fleet.AgentSpec{Capacity: -1}}, wantField: "spec.capacity"},
		{name: "zone not a label value", agent: fleet.Agent{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: fleet.AgentSpec{Zone: "eu 1"}}, wantField: "spec.zone"},
		{name: "condition without reason", agent: fleet.Agent{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: fleet.AgentStatus{
			Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, LastTransitionTime: metav1.Now()}}}},
			wantField: "status.conditions[0].reason"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkErrors(t, ValidateAgent(&tc.agent).ToAggregate(), tc.wantField)
		})
	}
}

func checkErrors(t *testing.T, err error, wantField string) {
	t.Helper()
	if wantField == "" {
		if err != nil {
			t.Fatalf("want valid, got %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), wantField) {
		t.Fatalf("want an error on %s, got %v", wantField, err)
	}
}
